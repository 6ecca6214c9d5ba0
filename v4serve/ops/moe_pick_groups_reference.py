"""The picks of one expert a tensor-core MoE program serves: the torch reference.

    members[p, :] = the picks of expert e = experts[p] with ranks r .. r + G - 1 among e's picks
                    (in pick order), -1 past the last,   where p is the pick of rank r and r % G == 0
    members[p, :] = -1                                    for every other pick

experts [P] int (expert ids, or the weight rows they live in), members [P, G] int32: a program per
pick runs, and only the pick that leads a run of G picks of its expert (in pick order) computes,
for all G of them. members[p, 0] == p exactly where p leads.
"""

import torch


def moe_pick_groups_reference(experts: torch.Tensor, group: int) -> torch.Tensor:
    members = torch.full((experts.numel(), group), -1, dtype=torch.int32)
    ids = experts.cpu().tolist()
    picks_of = {}
    for p, e in enumerate(ids):
        picks_of.setdefault(e, []).append(p)
    for picks in picks_of.values():
        for r in range(0, len(picks), group):
            run = picks[r:r + group]
            members[run[0], :len(run)] = torch.tensor(run, dtype=torch.int32)
    return members.to(experts.device)
