"""`kazeia gate`: op classes of a model (classes.py), their validation in child processes (child.py), the policy
that routes the failing ones by modeled time, its cache and its explanation (auto.py)."""
