#!/usr/bin/env bash
# Nsight Compute on the prefill MoE (moe_fp8_wide_k: the first layer's FC1 and FC2) of one prefill step on
# dummy full-size weights (GPU machine, from the repo root). The CUDA code is built with -lineinfo
# (kernels/CMakeLists.txt), so the source page puts the stalls on lines of moe_fp8_wide.cu (moe_fp8_sparse.cu).
# Usage: OUT=dir [MXSERVE=build/cli/mxserve] [PRESET=120b] [PP=2048] [ARGS=...] bash bench/device_ncu_moe.sh
# ARGS: more bench arguments, e.g. `--gpu-memory-utilization 0.3`: ncu backs up the device memory the process
# holds before each replay pass, so a large KV pool makes the profile of 20b time out.
# The sparse kernel of a wide decode step (moe_fp8_k: a 16-token pp step's 72 launches twice, then the
# first decode step's first layer): KERNEL=moe_fp8_k SKIP=144 PP=16 TG=2 BATCH=128.
# Out: moe.ncu-rep (the report), ncu.txt (its sections), source.csv (per SASS line, with the CUDA line:
# samples and stall reasons; empty where this ncu lacks --print-source), raw.csv (every metric) and
# stalls.txt (each kernel's stall reasons, cycles per issued instruction, largest first).
set -u
cd "$(dirname "$0")/.."
source bench/device_run_env.sh /tmp/mxserve-ncu-moe
BIN=${MXSERVE:-build/cli/mxserve}
[ -e "$BIN.gz" ] && gunzip -f "$BIN.gz"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 300 "$NCU" --clock-control none --kernel-name regex:${KERNEL:-moe_fp8_wide_k} --launch-skip ${SKIP:-0} --launch-count 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SourceCounters \
  --import-source yes -f -o "$OUT/moe" \
  "$BIN" bench --preset "${PRESET:-120b}" --pp "${PP:-2048}" --tg "${TG:-1}" --depth 0 --batch "${BATCH:-1}" --reps 1 ${ARGS:-} > "$OUT/ncu.log" 2>&1
echo "ncu rc=$?"
"$NCU" --import "$OUT/moe.ncu-rep" --page details > "$OUT/ncu.txt" 2>&1
"$NCU" --import "$OUT/moe.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/source.csv" 2>&1 || true
[ -s "$OUT/source.csv" ] || "$NCU" --import "$OUT/moe.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv" 2>&1 || true
# The warp stall reasons (WarpStateStats' metrics), per kernel, largest first: cycles a warp spends stalled on
# each reason per issued instruction (session 52's source page came back empty, so this is the fallback).
"$NCU" --import "$OUT/moe.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1 || true
python3 - "$OUT/raw.csv" > "$OUT/stalls.txt" << 'PY' || true
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
if len(rows) < 3: sys.exit("no raw metrics")
head = rows[0]
name = head.index("Kernel Name") if "Kernel Name" in head else None
cols = [j for j, h in enumerate(head) if "issue_stalled" in h and "per_issue_active" in h]
for r in rows[2:]:
    if len(r) != len(head): continue
    print(r[name][:80] if name is not None else "kernel")
    vals = []
    for j in cols:
        try: vals.append((float(r[j].replace(",", "")), head[j]))
        except ValueError: pass
    for v, h in sorted(vals, reverse=True)[:14]: print(f"  {v:8.2f}  {h}")
PY
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|Compute \(SM\)|Issue Slots Busy|Achieved Occupancy|Warp Cycles Per Issued|Stall" "$OUT/ncu.txt" | head -80
