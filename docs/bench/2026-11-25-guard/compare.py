"""Paired fast ÷ bare per repetition, per version; the guard's cost is the
ratio of the two versions' medians, with a bootstrap 95 % interval."""
import json, random, statistics, sys
def ratios(paths):
    out = {}
    for p in paths:
        d = json.load(open(p))
        by = {}
        for s in d['samples']:
            by[(s['Test'], s['Rep'], s['Config'])] = s['Value']
        for (t, r, c), v in by.items():
            if c == 'fast' and (t, r, 'bare') in by:
                out.setdefault(t, []).append(v / by[(t, r, 'bare')])
    return out
old = ratios(sys.argv[1].split(','))
new = ratios(sys.argv[2].split(','))
random.seed(1)
print('| test | fast ÷ bare before (median, min–max, n) | fast ÷ bare with the guard | with ÷ before [95 % bootstrap] |')
print('| --- | --- | --- | --- |')
for t in sorted(old):
    o, n = old[t], new[t]
    boots = sorted(statistics.median(random.choices(n, k=len(n))) / statistics.median(random.choices(o, k=len(o))) for _ in range(5000))
    print(f'| {t} | {statistics.median(o):.3f} ({min(o):.3f}–{max(o):.3f}, n={len(o)}) | {statistics.median(n):.3f} ({min(n):.3f}–{max(n):.3f}, n={len(n)}) | {statistics.median(n)/statistics.median(o):.3f} [{boots[125]:.3f} – {boots[4875]:.3f}] |')
