#!/usr/bin/env python3
"""Merges what bench/gpu/check.sh measured into one JSON file and prints the table of qkv's families
beside PyTorch's SDPA: for each shape, the attention's device milliseconds (qkv bench, timestamps
around the attention) and TFLOP/s, and qkv ÷ torch (torch's time over qkv's: 1 = as fast).

    python3 bench/gpu/summarize.py --work DIR --out FILE.json

DIR holds qkv_bench_*.json (qkv bench --json), qkv_serve_*.json (qkv bench --serve --json: kept as
they are, under "serve"), qkv_backward_*.json (qkv bench --backward --json),
torch.json (bench/gpu/torch_sdpa.py, its rows with "backward" the training ones), steps.json (the
script's own record: what was found, what ran, how long, what failed). Standard library only. The
backward table: qkv's forward and backward milliseconds beside PyTorch's, and qkv ÷ torch for the
backward (torch's time over qkv's). Its FLOP: 2.5 times the forward's 4·B·H·N²·d (half with
causal), FlashAttention-2's convention.
"""
import argparse
import glob
import json
import os


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{path}: {e}"}


def flat(row):
    """A qkv bench row with its options (the one field list's JSON object) beside its own keys."""
    return dict(row.get("options") or {}, **row)


def key(row):
    return (row.get("seq"), row.get("kv_seq", row.get("seq")), row.get("dim"), bool(row.get("causal")),
            row.get("precision"), bool(row.get("decode")) or row.get("impl") == "decode")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    steps = load(os.path.join(a.work, "steps.json"))
    qkv_rows, devices = [], []
    for path in sorted(glob.glob(os.path.join(a.work, "qkv_bench_*.json"))):
        b = load(path)
        if "results" not in b:
            continue
        devices.append(b.get("device"))
        if "ceiling" in b:
            steps.setdefault("ceiling", b["ceiling"])
        qkv_rows += [dict(flat(r), source=os.path.basename(path)) for r in b["results"]]
    serve = [dict(load(path).get("serve") or {}, source=os.path.basename(path))
             for path in sorted(glob.glob(os.path.join(a.work, "qkv_serve_*.json")))]
    torch = load(os.path.join(a.work, "torch.json"))
    torch_by_key = {key(r): r for r in torch.get("rows", []) if not r.get("backward")}
    torch_backward = {key(r): r for r in torch.get("rows", []) if r.get("backward")}

    table = []
    for r in qkv_rows:
        if r.get("skipped") or "attention_ms" not in r:
            table.append({"qkv": r})
            continue
        t = torch_by_key.get(key(r))
        entry = {"qkv": r}
        ms = r["attention_ms"]["median"]
        flop = r.get("attention_flop") or 0
        entry["qkv_tflops"] = flop / (ms * 1e-3) / 1e12 if ms > 0 else None
        if t and t.get("ms"):
            entry["torch"] = t
            entry["qkv_over_torch"] = t["ms"]["median"] / ms if ms > 0 else None
        table.append(entry)

    backward = []
    for path in sorted(glob.glob(os.path.join(a.work, "qkv_backward_*.json"))):
        b = load(path).get("backward")
        if not b:
            continue
        for r in b.get("rows", []):
            r = dict(r, batch=b.get("batch"), heads=b.get("heads"), kv_heads=b.get("kv_heads"), source=os.path.basename(path))
            entry = {"qkv": r}
            if r.get("skipped") or "backward_ms" not in r:
                backward.append(entry)
                continue
            flop = 4.0 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["dim"] * (0.5 if r.get("causal") else 1.0)
            ms = r["backward_ms"]["median"]
            entry["qkv_backward_tflops"] = 2.5 * flop / (ms * 1e-3) / 1e12 if ms > 0 else None
            t = torch_backward.get(key(dict(r, kv_seq=r["seq"])))
            if t and t.get("backward_ms"):
                entry["torch"] = t
                entry["qkv_over_torch_backward"] = t["backward_ms"]["median"] / ms if ms > 0 else None
            backward.append(entry)

    goal = [e for e in table if e.get("qkv_over_torch") and e["qkv"].get("seq") == 4096 and e["qkv"].get("dim") == 128
            and e["qkv"].get("precision") == "fp16" and e["qkv"].get("impl") == "sdpa"]
    result = {"steps": steps, "devices": devices, "torch": torch.get("info"), "table": table, "backward": backward, "serve": serve,
              "goal_n4096_d128_fp16": [{"kernel": e["qkv"].get("kernel"), "causal": e["qkv"].get("causal"),
                                        "qkv_over_torch": e["qkv_over_torch"]} for e in goal]}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)

    print(f"{'N':>6} {'S':>6} {'d':>4} {'causal':>6} {'prec':>5} {'kernel':>8} {'qkv ms':>10} {'TFLOP/s':>8} "
          f"{'torch':>10} {'ms':>10} {'qkv/torch':>9}")
    for e in table:
        r = e["qkv"]
        if r.get("skipped") or "attention_ms" not in r:
            print(f"{r.get('seq', '?'):>6} {r.get('kv_seq', r.get('seq', '?')):>6} {r.get('dim', '?'):>4} "
                  f"{str(r.get('causal')):>6} {r.get('precision', '?'):>5} {r.get('kernel', '?'):>8}  skipped: "
                  f"{r.get('skipped', 'no timing')}")
            continue
        t = e.get("torch", {})
        print(f"{r['seq']:>6} {r.get('kv_seq', r['seq']):>6} {r['dim']:>4} {str(r['causal']):>6} {r['precision']:>5} "
              f"{r.get('kernel', '-'):>8} {r['attention_ms']['median']:10.3f} {e.get('qkv_tflops') or 0:8.2f} "
              f"{t.get('backend', '-') or '-':>10} {t.get('ms', {}).get('median', float('nan')):10.3f} "
              f"{e.get('qkv_over_torch') or float('nan'):9.3f}")
    if backward:
        print(f"\nBackward (qkv bench --backward beside torch.autograd.grad of PyTorch's SDPA):")
        print(f"{'N':>6} {'d':>4} {'causal':>6} {'prec':>5} {'kernel':>11} {'qkv fwd ms':>10} {'qkv bwd ms':>10} {'TFLOP/s':>8} "
              f"{'torch':>10} {'bwd ms':>10} {'qkv/torch':>9}")
    for e in backward:
        r, t = e["qkv"], e.get("torch", {})
        if r.get("skipped") or "backward_ms" not in r:
            print(f"{r.get('seq', '?'):>6} {r.get('dim', '?'):>4} {str(r.get('causal')):>6} {r.get('precision', '?'):>5} "
                  f"{r.get('kernel', '-'):>11}  skipped: {r.get('skipped', 'no timing')}")
            continue
        print(f"{r['seq']:>6} {r['dim']:>4} {str(r['causal']):>6} {r['precision']:>5} {r.get('kernel', '-'):>11} "
              f"{r['forward_ms']['median']:10.3f} "
              f"{r['backward_ms']['median']:10.3f} {e.get('qkv_backward_tflops') or 0:8.2f} "
              f"{t.get('backend', '-') or '-':>10} {t.get('backward_ms', {}).get('median', float('nan')):10.3f} "
              f"{e.get('qkv_over_torch_backward') or float('nan'):9.3f}")
    for g in result["goal_n4096_d128_fp16"]:
        print(f"goal (>= 0.3 x PyTorch's flash at N = 4096, d = 128, fp16): {g['kernel']} causal {g['causal']}: "
              f"{g['qkv_over_torch']:.3f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
