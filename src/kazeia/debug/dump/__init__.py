"""Op dumps: the exact inputs and output of chosen ops, written so that one op can be rerun anywhere.

`DumpHook(regex, dir)` is an ordinary execution hook. For every op whose node name matches it writes:
the op's logical inputs as read at `on_start` (what the op consumes) and its output at `on_complete` (after
the op finished on its device, never when it was queued), each read through ne/nb; the op params; each
source's type/ne/nb/name/role/place in memory; the GGUF names and raw block bytes of the weights (so a
replay needs nothing else); the device, and for the HTP its settings, profile and batch context.

The batch context is what separates a value-triggered fault from a context-triggered one on the HTP: the
ops that ran before this one in its batch (names, params, tensors, descriptor indexes), the VTCM contents
and DSP state at the start of the batch, and the memory those ops read (every byte range their tensors
span, weights included) with the original buffer addresses and offsets, so that a replay can rebuild the
same tensors at the same addresses and the host's descriptor de-duplication (data address + ne + nb) maps
them to the same descriptors. It is snapshotted (HtpBackend.snapshot) from a batch-start hook the dump hook
registers with HtpBackend.add_batch_start_hook in `bind_backend` (called by the HTP backend at graph start).

`at="enqueue"` (or "both") also writes an ENQUEUE-time capture of the same tensors, labelled as such: what
a host-side dump taken when the op was queued sees. On an asynchronous backend that is not what the op
consumed (its producer may not have run yet: zeros or stale bytes); `compare_captures` shows the difference.
On a synchronous backend enqueue and start are the same moment.

On disk (format FORMAT, version VERSION), DIR holds `index.json`, one directory per capture with a
`manifest.json` (JSON only), and `blobs/<sha256>.npy|.npz`: content-addressed arrays (weights are stored once
however many dumps use them). Loading verifies the format, the version, every field against the schema (types,
ranges, sizes within the CLI's limits, before anything is allocated) and every blob's content hash (the batch
context's too, which only --with-context reads), and never executes anything from the files (JSON, and numpy
files with allow_pickle=False): a corrupt, truncated, forged or foreign dump is a `DumpFileError`.

The parts: `format` (names, versions, tensor and settings descriptions, manifests), `schema` (the checks of
every field), `blobs` (the blob store),
`hook` (DumpHook and the --dump flags), `context` (the batch context), `load` (loading and validation) and
`diff` (enqueue-time against completion-time captures).
"""

from kazeia.debug.dump.blobs import BlobStore, array_digest
from kazeia.debug.dump.diff import CaptureDiff, TensorDiff, compare_captures
from kazeia.debug.dump.format import (
    CAPTURES,
    COMPLETE_NOTE,
    ENQUEUE_NOTE,
    FORMAT,
    SYNC_ENQUEUE_NOTE,
    VERSION,
    manifest_digest,
    settings_dict,
    source_role,
    tensor_meta,
)
from kazeia.debug.dump.hook import DumpHook, add_dump_args, install_dump
from kazeia.debug.dump.load import Dump, TensorRecord, find_pair, load_dump, load_dumps
from kazeia.debug.tensors import logical_values, read_extent

__all__ = [
    "CAPTURES", "COMPLETE_NOTE", "ENQUEUE_NOTE", "FORMAT", "SYNC_ENQUEUE_NOTE", "VERSION", "BlobStore", "CaptureDiff",
    "Dump", "DumpHook", "TensorDiff", "TensorRecord", "add_dump_args", "array_digest", "compare_captures",
    "find_pair", "install_dump", "load_dump", "load_dumps", "logical_values", "manifest_digest", "read_extent",
    "settings_dict", "source_role", "tensor_meta",
]
