"""A Q4_0 copy of a GGUF without llama-quantize: every quantized 2-D tensor is dequantized (gguf-py) and
requantized to Q4_0 (gguf-py's quantizer, byte-exact with llama.cpp's reference Q4_0), the rest copied as is,
all metadata kept (general.file_type set to 2, MOSTLY_Q4_0). This is what `llama-quantize --allow-requantize
--pure SRC DST Q4_0` does for the formats used here; bench_cpu.py uses llama-quantize when it is there.

    python bench/requant.py SRC.gguf DST.gguf
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf import quants as gq

QUANTIZED = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)


def requantize_q4_0(src: str, dst: str) -> None:
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        val = 2 if name == "general.file_type" else f.contents()
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(name, val, f.types[0], sub_type=sub)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # numpy order
        if t.tensor_type in QUANTIZED and len(shape) == 2 and shape[-1] % 32 == 0:
            vals = gq.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            w.add_tensor(t.name, gq.quantize(vals, T.Q4_0), raw_dtype=T.Q4_0)  # byte rows; gguf-py infers the shape
        elif t.tensor_type in (T.F32, T.F16):
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    requantize_q4_0(sys.argv[1], sys.argv[2])
