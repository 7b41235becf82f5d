#!/usr/bin/python3
"""An independent NumPy (float32) implementation of the compact Adam step (core/quant_math.h,
docs/kernels.md "Compact state"), for kernels/quant_test.cc: reads the cases the test wrote (inputs and
the kernel's outputs as raw bytes, cases.json), recomputes each output from the documented rule and
exits 1 naming the first element that differs by a single bit.

Written from the rule, not from the C++: q8 codes are found by searching the table of code values for
the nearest (ties to the even code), q4 codes by counting the midpoints at or below r (ties away from
zero), fused multiply-adds are exact (round to odd in float64, then to
float32), the rounding bits come from the hash computed in uint32 arithmetic."""
import json
import os
import sys

import numpy as np

F32, F64, U32 = np.float32, np.float64, np.uint32


def code_values(signed):
    """The value of every code, in float64 (exact), and which codes the encoder may produce."""
    vals = np.zeros(256, F64)
    for c in range(256):
        f = c & 7
        e = (c >> 3) & 15 if signed else c >> 3
        bias = 15 if signed else 31
        mag = np.ldexp(f / 8, 1 - bias) if e == 0 else np.ldexp(1 + f / 8, e - bias)
        vals[c] = -mag if signed and c & 0x80 else mag
    return vals


def encode(x, recip, signed):
    """Nearest code to min(|x| * recip, 1), ties to the even code; the sign from x when not 0."""
    r = np.minimum(np.abs(x).astype(F32) * F32(recip), F32(1)).astype(F64)
    table = code_values(False)[: 249] if not signed else code_values(True)[: 121]
    idx = np.searchsorted(table, r)  # table ascending: codes 0.. are increasing magnitudes
    lo = np.clip(idx - 1, 0, len(table) - 1)
    hi = np.clip(idx, 0, len(table) - 1)
    dlo, dhi = r - table[lo], table[hi] - r
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = pick.astype(np.uint8)
    if signed:
        neg = (x.view(U32) >> 31).astype(bool) & (pick != 0)
        pick = pick | np.where(neg, 0x80, 0).astype(np.uint8)
    return pick


def decode(codes, scale, block, signed):
    vals = code_values(signed).astype(F32)[codes]
    return (vals * np.repeat(scale, block)[: len(codes)]).astype(F32)


# q4: the signed magnitudes are FP4 E2M1's {0, .5, 1, 1.5, 2, 3, 4, 6} over 6, each the nearest f32;
# unsigned codes c are (c + 1) / 16 (no zero).
Q4_SIGNED = np.array([F32(e) / F32(6) for e in (0, 0.5, 1, 1.5, 2, 3, 4, 6)], F32)
Q4_SIGNED_MID = np.array([F32((a + b) / 12) for a, b in zip((0, 0.5, 1, 1.5, 2, 3, 4), (0.5, 1, 1.5, 2, 3, 4, 6))], F32)


def q4_values(signed):
    if signed:
        return np.concatenate([Q4_SIGNED, -Q4_SIGNED])
    return (np.arange(16, dtype=F64) + 1) / 16


def q4_unpack(packed, n):
    codes = np.empty(len(packed) * 2, np.uint8)
    codes[0::2], codes[1::2] = packed & 15, packed >> 4
    return codes[:n]


def q4_pack(codes):
    c = np.concatenate([codes, np.zeros(len(codes) % 2, np.uint8)])
    return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)


def q4_encode(x, recip, signed):
    r = np.minimum(np.abs(x).astype(F32) * F32(recip), F32(1))
    if not signed:
        k = np.floor(r.astype(F64) * 16 + 0.5)
        return (np.maximum(k, 1) - 1).astype(np.uint8)
    m = (r[:, None] >= Q4_SIGNED_MID[None, :]).sum(axis=1).astype(np.uint8)
    neg = (x.view(U32) >> 31).astype(bool) & (m != 0)
    return m | np.where(neg, 8, 0).astype(np.uint8)


def q4_decode(packed, n, scale, block, signed):
    vals = q4_values(signed).astype(F32)[q4_unpack(packed, n)]
    return (vals * np.repeat(scale, block)[:n]).astype(F32)


def fma(a, b, c):
    """float32 fused multiply-add: the exact a*b + c rounded once (round to odd in float64)."""
    p = a.astype(F64) * b.astype(F64)
    c = np.broadcast_to(c, p.shape).astype(F64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    t = np.where((err != 0) & (np.sign(err) != np.sign(s)), np.nextafter(s, 0), s)
    odd = (t.view(np.uint64) & 1).astype(bool)
    t = np.where((err != 0) & ~odd, np.nextafter(t, np.copysign(np.inf, t)), t)
    return t.astype(F32)


def bf16_to_f32(h):
    return (h.astype(U32) << 16).view(F32)


def f32_to_bf16(x):  # round to nearest even (no NaN here)
    u = x.view(U32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def fmix32(h):
    h = h.astype(U32)
    h ^= h >> U32(16)
    h = (h.astype(np.uint64) * 0x85EBCA6B & 0xFFFFFFFF).astype(U32)
    h ^= h >> U32(13)
    h = (h.astype(np.uint64) * 0xC2B2AE35 & 0xFFFFFFFF).astype(U32)
    h ^= h >> U32(16)
    return h


def rounding_bits(seed, step, index):
    k = fmix32(np.array([seed ^ 0x5BD1E995], U32))
    k = fmix32(k ^ U32(step & 0xFFFFFFFF))
    k = fmix32(k ^ U32(step >> 32))
    k = fmix32(k ^ (index >> 32).astype(U32))
    return fmix32(k ^ (index & 0xFFFFFFFF).astype(U32)) >> U32(16)


def adam(sc, p, g, m, v, usual):
    f = {k: F32(np.array(sc[k], U32).view(F32))
         for k in ("beta1", "beta2", "omb1", "omb2", "eps", "l2", "decay", "nss", "bc2", "cstep", "ceps", "gs")}
    g = g * f["gs"]
    if sc["use_l2"]:
        g = fma(p, np.full_like(p, f["l2"]), g)
    if sc["use_decay"]:
        p = p * f["decay"]
    m = fma(g, np.full_like(g, f["omb1"]), f["beta1"] * m)
    v = fma(f["omb2"] * g, g, f["beta2"] * v)
    if usual:  # f32 state with a master: PyTorch's order, two divides
        p = p + (f["nss"] * m) / (np.sqrt(v) / f["bc2"] + f["eps"])
    else:  # compact state: Kingma & Ba's form, one divide
        p = p + (f["cstep"] * m) / (np.sqrt(v) + f["ceps"])
    return p.astype(F32), m.astype(F32), v.astype(F32)


def store_moments(c, m, v):
    """The stored forms of the new moments: per q8 or q4 block scale and codes, with the coupling."""
    block, n = c["block"], c["numel"]
    out = {}
    nb = (n + block - 1) // block
    pad = nb * block - n
    def block_max(x):
        return np.concatenate([np.abs(x), np.zeros(pad, F32)]).reshape(nb, block).max(axis=1).astype(F32)

    def recip_of(s):
        return np.where(s > 0, F32(1) / np.where(s > 0, s, F32(1)), F32(0)).astype(F32)

    scale = {}
    if c["v"] in ("q8", "q4"):
        scale["v"] = block_max(v)
        recip = recip_of(scale["v"])
        enc = encode if c["v"] == "q8" else q4_encode
        codes = np.concatenate([enc(v[i * block:(i + 1) * block], recip[i], False) for i in range(nb)])
        out["v"], out["v_scale"] = codes if c["v"] == "q8" else q4_pack(codes), scale["v"]
        # Where the stored second moment decodes to 0 the first moment is stored as 0.
        zero = codes == 0 if c["v"] == "q8" else np.repeat(scale["v"] == 0, block)[:n]
        m = np.where(zero, F32(0), m).astype(F32)
    if c["m"] in ("q8", "q4"):
        scale["m"] = block_max(m)  # of what is stored: after the coupling
    for name, x in (("m", m), ("v", v)):
        if name in out:
            continue
        if c[name] in ("q8", "q4"):
            recip = recip_of(scale[name])
            enc = encode if c[name] == "q8" else q4_encode
            codes = np.concatenate([enc(x[i * block:(i + 1) * block], recip[i], True) for i in range(nb)])
            out[name] = codes if c[name] == "q8" else q4_pack(codes)
            out[name + "_scale"] = scale[name]
        else:
            out[name] = x if c[name] == "f32" else f32_to_bf16(x)
    return out


def run_case(d, c):
    def load(name, dtype, suffix="in"):
        return np.fromfile(os.path.join(d, f"{c['id']}.{name}.{suffix}"), dtype)

    n, block = c["numel"], c["block"]
    moment = {"f32": F32, "bf16": np.uint16, "q8": np.uint8, "q4": np.uint8}

    def moment_in(name):
        raw = load(name, moment[c[name]])
        if c[name] == "f32":
            return raw
        if c[name] == "bf16":
            return bf16_to_f32(raw)
        if c[name] == "q4":
            return q4_decode(raw, n, load(name + "_scale", F32), block, name == "m")
        return decode(raw, load(name + "_scale", F32), block, name == "m")

    p = load("p", F32) if c["master"] else bf16_to_f32(load("p", np.uint16))
    g = load("g", F32) if c["grad"] == "f32" else bf16_to_f32(load("g", np.uint16))
    usual = c["master"] and c["m"] == "f32" and c["v"] == "f32"
    p, m, v = adam(c["scalars"], p, g, moment_in("m"), moment_in("v"), usual)
    want = store_moments(c, m, v)
    if c["master"]:
        want["p"] = p
        if c["copy"]:
            want["copy"] = f32_to_bf16(p)
    else:
        bits = rounding_bits(c["seed"], c["step"], np.arange(c["index"], c["index"] + n, dtype=np.uint64))
        want["p"] = ((p.view(U32).astype(np.uint64) + bits) >> 16).astype(np.uint16)
    for name, w in want.items():
        got = load(name, w.dtype, "out")
        bad = np.nonzero(got.view(np.uint8).reshape(len(got), -1) != w.view(np.uint8).reshape(len(w), -1))[0]
        if got.shape != w.shape or len(bad):
            i = bad[0] if len(bad) else 0
            print(f"case {c['id']} ({c['m']}/{c['v']}, master {c['master']}): {name}[{i}] kernel {got[i]!r} reference {w[i]!r}")
            return False
    return True


def main():
    d = sys.argv[1]
    cases = json.load(open(os.path.join(d, "cases.json")))
    ok = all([run_case(d, c) for c in cases])
    print(f"{len(cases)} cases: {'identical' if ok else 'DIFFER'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
