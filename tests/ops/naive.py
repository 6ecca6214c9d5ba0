"""Independent float64 oracles, written as plain loops over the formulas of the reference docs."""

import math

import torch


def naive_sparse_attn(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts=None):
    B, M, H, D = q.shape
    out = torch.zeros(B, M, H, D, dtype=torch.float64)
    for b in range(B):
        for m in range(M):
            rows = []
            for c, r in enumerate(idx[b, m].tolist()):
                if r < 0:
                    continue
                if c < n_window:
                    rows.append(win_pool[r])
                elif counts is None or c - n_window < int(counts[b, m]):
                    rows.append(cmp_pool[r])
            if not rows:
                continue
            kv = torch.stack(rows).double()
            for h in range(H):
                e = torch.exp(kv @ q[b, m, h].double() * scale)
                out[b, m, h] = (e[:, None] * kv).sum(0) / (e.sum() + math.exp(float(sink[h])))
    return out


def naive_gated_pool(kv, score):
    B, R, D = kv.shape
    out = torch.zeros(B, D, dtype=torch.float64)
    for b in range(B):
        for d in range(D):
            e = [math.exp(float(score[b, r, d])) for r in range(R)]
            out[b, d] = sum(e[r] * float(kv[b, r, d]) for r in range(R)) / sum(e)
    return out


def naive_index_scores(q, weights, k_pool, key_rows, n_visible):
    B, S, H, _ = q.shape
    T = key_rows.shape[1]
    out = torch.full((B, S, T), float("-inf"), dtype=torch.float64)
    for b in range(B):
        for s in range(S):
            for t in range(min(T, int(n_visible[b, s]))):
                r = int(key_rows[b, t])
                if r >= 0:
                    dots = q[b, s].double() @ k_pool[r].double()
                    out[b, s, t] = float((weights[b, s].double() * dots.clamp(min=0)).sum())
    return out


def _nearest_even_code(y: float, grid: list[float]) -> float:
    """Nearest grid value to |y| (grid sorted by code), ties to the even code, sign of y kept."""
    a = abs(y)
    best = min(range(len(grid)), key=lambda i: (abs(grid[i] - a), i % 2))
    return math.copysign(grid[best], y)


E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E4M3_GRID = [m / 8 * 2.0**-6 for m in range(8)] + [
    (1 + m / 8) * 2.0**e for e in range(-6, 9) for m in range(8) if (1 + m / 8) * 2.0**e <= 448
]


def naive_block_round_trip(x, block, n_quant, grid, qmax, floor, scale_kind):
    """scale_kind: 'ue8m0' (power of two, exact ceil of log2) or 'e4m3' (scale itself rounded to e4m3)."""
    x32 = x.float()
    out = x32.clone().double()
    flat, res = x32.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    for i in range(flat.shape[0]):
        for g in range(0, n_quant, block):
            group = flat[i, g : g + block]
            ratio = float(torch.tensor(max(float(group.abs().max()), floor), dtype=torch.float32) / qmax)
            s = 2.0 ** math.ceil(math.log2(ratio)) if scale_kind == "ue8m0" else _nearest_even_code(ratio, E4M3_GRID)
            for j in range(block):
                y = float(torch.tensor(float(group[j]), dtype=torch.float32) / torch.tensor(s, dtype=torch.float32))
                res[i, g + j] = _nearest_even_code(max(-qmax, min(qmax, y)), grid) * s
    return out


def sylvester_hadamard(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)
