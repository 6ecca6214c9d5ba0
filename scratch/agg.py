import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
# find header row with 'Address' and 'Source'
hi = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
hdr = rows[hi]; data = rows[hi+1:]
cols = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith("stall_") or "Warp Stall Sampling (All" in h]
samp = [h for h in hdr if "Warp Stall Sampling (All Samples)" in h] or [h for h in hdr if "Sampling" in h]
print("sampling col:", samp[:2])
sc = cols[samp[0]]
tot = 0; lst = []
for r in data:
    try: v = float(r[sc] or 0)
    except: continue
    tot += v; lst.append((v, r[cols["Address"]], r[cols["Source"]][:90]))
lst.sort(reverse=True)
print("total samples", tot)
for v, a, s in lst[:45]: print(f"{100*v/tot:5.1f}% {a} {s}")
