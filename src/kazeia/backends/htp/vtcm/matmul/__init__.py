"""MUL_MAT plans by upstream version: the plan record, May's HMX and HVX plans (the DSP's own), October's host
solvers, and the dispatch that picks one for a node."""
