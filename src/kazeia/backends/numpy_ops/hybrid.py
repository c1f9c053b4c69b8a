"""The ops of the gated-delta-net and short-conv layers (Qwen3.5, Qwen3-Next, LFM2), with ggml-cpu's semantics
(ops.cpp)."""

from __future__ import annotations

import numpy as np

from kazeia.backends.numpy_ops.base import NumpyOps, kernel, numpy_matvec
from kazeia.graph.builder import gdn_snapshots
from kazeia.graph.tensor import Tensor


@kernel("CONCAT")
def _concat(be: NumpyOps, n: Tensor) -> None:
    be.store(n, np.concatenate([be.load(n.src[0]), be.load(n.src[1])], axis=3 - n.params["dim"]))


@kernel("L2_NORM")
def _l2_norm(be: NumpyOps, n: Tensor) -> None:
    x = be.load(n.src[0])
    ss = be.sum_squares(x)  # sum of squares in double, as ggml
    scale = (1.0 / np.maximum(np.sqrt(ss), n.params["eps"])).astype(be.ft)
    be.store(n, x * scale[..., None])


@kernel("SSM_CONV")
def _ssm_conv(be: NumpyOps, n: Tensor) -> None:
    sx = be.load(n.src[0])[0]  # (n_s, d_inner, d_conv - 1 + n_t)
    c = be.load(n.src[1])[0, 0]  # (d_inner, d_conv)
    n_t = n.ne[1]
    acc = sx[:, :, 0:n_t] * c[:, 0:1]
    for j in range(1, c.shape[1]):  # the taps in order, as ggml sums them
        acc = acc + sx[:, :, j:j + n_t] * c[:, j:j + 1]
    be.store(n, acc.transpose(0, 2, 1)[None])  # [d_inner, n_t, n_s]


def delta_rule(q, k, v, g, beta, m, scale, snapshots=None, exp=np.exp, matvec=numpy_matvec):
    """The gated delta rule over T tokens, in place on the states m (n_seqs, H, S_v, S_k): m[j, i] is S[i][j]
    (ggml keeps the state transposed). q, k (n_seqs, T, H, S) already broadcast to H heads; v (n_seqs, T, H,
    S); g (n_seqs, T, H, 1 | S) log-decays; beta (n_seqs, T, H). Per token: decay, delta = beta (v - S^T k),
    S += k delta^T, o = scale S^T q. Returns o (n_seqs, T, H, S); snapshots(t, m) after each token if given."""
    o = np.empty(v.shape, dtype=v.dtype)
    for t in range(v.shape[1]):
        decay = exp(g[:, t])  # (n_seqs, H, 1 | S)
        m *= decay[:, :, None, :] if decay.shape[-1] > 1 else decay[:, :, :, None]
        sk = matvec(m, k[:, t])  # (n_seqs, H, S_v)
        delta = (v[:, t] - sk) * beta[:, t, :, None]
        m += delta[..., :, None] * k[:, t, :, None, :]
        o[:, t] = matvec(m, q[:, t]) * scale
        if snapshots is not None:
            snapshots(t, m)
    return o


@kernel("GATED_DELTA_NET")
def _gated_delta_net(be: NumpyOps, n: Tensor) -> None:
    qt, kt, vt, gt, bt, st = n.src
    S, H, T, n_seqs = vt.ne
    K = gdn_snapshots(n)
    seqs, heads = np.arange(n_seqs), np.arange(H)

    def bcast(t: Tensor) -> np.ndarray:  # (n_seqs, T, H, S): tiled over heads, grouped over sequences
        x = be.load(t)
        return x[seqs // (n_seqs // t.ne[3])][:, :, heads % t.ne[1]]

    q, k, v = bcast(qt), bcast(kt), be.load(vt)
    g, beta = be.load(gt), be.load(bt)[..., 0]
    m = np.array(be.load(st).reshape(n_seqs, -1, H * S * S)[:, 0].reshape(n_seqs, H, S, S))  # each one's slot 0
    out = be.load(n).reshape(-1).copy() if K > 1 else np.empty(n.nelements, dtype=be.ft)
    n_att = S * H * T * n_seqs
    snaps = out[n_att:].reshape(K, n_seqs, H, S, S)
    keep = None
    if K > 1:  # the last min(T, K) per-token states go to the trailing slots; earlier slots are left as they are
        def keep(t: int, state: np.ndarray) -> None:
            if 0 <= t - (T - K) < K:
                snaps[t - (T - K)] = state
    o = delta_rule(q, k, v, g, beta, m, be.ft(1.0 / np.sqrt(S)), keep, be.math.exp, be.matvec)
    out[:n_att] = o.reshape(-1)
    if K == 1:
        snaps[0] = m
    be.store(n, out)
