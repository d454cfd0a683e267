"""Write the length tables of long_context.yaml: chat requests with a few very long prompts.

``experiments/data/long_context_{32k,64k,128k}.csv`` (Vidur/Etalon ``lengths`` format): the first
390 ShareGPT rows of the shipped Etalon table whose prompt + output fit in 4,096 tokens (the chat
requests), plus 10 rows of one long prompt (32,768 / 65,536 / 130,944 tokens) with a 128-token
output, i.e. 2.5% long requests; the experiment shuffles the rows (a fresh order per pass).
Run from the repository root: ``python3 experiments/long_context_mix.py``.
"""

import csv
from pathlib import Path

TRACES = Path("workloads/traces/etalon_processed_traces")
SRC = TRACES / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
LONG = {"32k": 32768, "64k": 65536, "128k": 131072 - 128}  # 128k: prompt + output = 131,072


def main() -> None:
    with SRC.open() as f:
        chat = [
            (int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
            for r in csv.DictReader(f)
            if int(r["num_prefill_tokens"]) + int(r["num_decode_tokens"]) <= 4096
        ][:390]
    out = Path("experiments/data")
    out.mkdir(exist_ok=True)
    for tag, n in LONG.items():
        with (out / f"long_context_{tag}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["num_prefill_tokens", "num_decode_tokens"])
            w.writerows(chat + [(n, 128)] * 10)


if __name__ == "__main__":
    main()
