"""The native kernels of the HTP numerics, one family per file (its IR, its typed front, its portable twin side by
side; a family too big for one file is a folder): rounding (fp16 hardware rounding, fp16 rows), quant (the HVX
activation quantizer), hvx/ (the HVX vec_dot), hmx (the HMX weight dequant), fa (flash attention's element-wise
passes), vtcm_copy (the DSP's bookkeeping copies). Every front gives the bits of the numpy model it stands for.
"""
