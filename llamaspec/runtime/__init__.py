"""The one place that touches llama_cpp: models, contexts, batches (llama.py), the CPU policy (cpu.py), build facts (info.py)."""
