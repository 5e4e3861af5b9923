#!/usr/bin/env python3
"""A stand-in for ncu on machines without a GPU: reads the job pickle it was asked to profile
and writes, to --log-file, ncu's details-page CSV for one launch per job (values derived from
the job's position, so that a test can tell them apart). ``FAKE_NCU_MODE`` makes it fail the
way ncu does: ``noperm`` (ERR_NVGPUCTRPERM), ``short`` (profiles only the first launch),
``failed`` (the second launch fails: ncu writes its row with every metric n/a, and the target
stops)."""

import os
import pickle
import sys

args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
metrics = args[args.index("--metrics") + 1].split(",")
assert "--profile-from-start" in args and args[args.index("--profile-from-start") + 1] == "off"
with open(args[-1], "rb") as job_file:
    jobs = pickle.load(job_file)
mode = os.environ.get("FAKE_NCU_MODE", "")
if mode == "noperm":
    print(
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters on the target device 0."
    )
    sys.exit(1)
count = {"short": 1, "failed": 2}.get(mode, len(jobs))
header = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
    '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
    '"Metric Value"'
)
rows = [header]
for i in range(count):
    for k, metric in enumerate(metrics):
        value = f"{1000 * (i + 1) + k:,}"  # thousands separators, as ncu prints them
        if mode == "failed" and i == 1:
            value = "n/a"
        rows.append(
            f'"{i}","42","python3","host","{jobs[i].kernel_name}","1","7","(256, 1, 1)",'
            f'"(64, 1, 1)","0","9.0","Command line profiler metrics","{metric}","",'
            f'"{value}"'
        )
with open(log, "w") as out:
    out.write("\n".join(rows) + "\n")
print("==PROF== Disconnected from process 42")
