"""Transforms for fine-tuning: LoRA adapters (peft) and quantized weights (bitsandbytes, float8)."""
