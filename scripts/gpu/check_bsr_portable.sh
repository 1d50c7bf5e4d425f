#!/usr/bin/env bash
# Checks the block-sparse kernels of `gemm_bsr.cuh` that `validate.py --target auto` does not
# reach on a Hopper GPU, from the repository root on a CUDA machine (after `scripts/gpu/build.sh`):
# the `mma.sync` kernel (`--target cuda:sm_90`) of the block-sparse cases, and f32 copies of
# them on the FP64 tensor cores and the FFMA pipes, at T = 1, 77 and 1000; then a 16 -> 32
# linear at T = 8390000, whose 65547 row tiles of 128 fill one `Grid::RowTiles` layer of 65535
# and spill into a second (`SKIP_CASES=1` runs only these). About 3 minutes on an H200; the
# exit status is 1 if any check fails.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
M=target/release/mlpc
export MLPC_CACHE_DIR=/tmp/chk-cache
fail=0
c() { if timeout 200 "$@" > /tmp/c.log 2>&1; then grep -h "^ok" /tmp/c.log | head -3; else echo "FAIL: $*"; tail -5 /tmp/c.log; fail=1; fi; }
[ -z "${SKIP_CASES:-}" ] && for d in tests/cases/sparse-geglu-b16 tests/cases/sparse-pairs-b32 tests/cases/sparse-residual-b64 examples/bert-sparse-ffn; do
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); m["dtype"]="f32"; json.dump(m,open(sys.argv[2],"w"))' $d/model.json /tmp/$(basename $d)-f32.json
  for t in 1 77 1000; do
    c $M check $d/model.json --target cuda:sm_90 --bind T=$t
    c $M check /tmp/$(basename $d)-f32.json --bind T=$t
    c $M check /tmp/$(basename $d)-f32.json --f32-ffma --bind T=$t
  done
done
python3 -c 'import json; [json.dump({"mlpc":1,"name":"bsr-tall-"+dt,"dtype":dt,"seed":0,"inputs":{"x":{"shape":["T",16]}},"layers":[{"op":"linear","name":"fc","in":16,"out":32,"bias":True}],"sparsity":{"fc.weight":{"block":[16,16],"density":0.5}}}, open("/tmp/tall-"+dt+".json","w")) for dt in ("f32","bf16")]'
c $M check /tmp/tall-f32.json --bind T=8390000
c $M check /tmp/tall-f32.json --f32-ffma --bind T=8390000
c $M check /tmp/tall-bf16.json --target cuda:sm_90 --bind T=8390000
c $M compile /tmp/tall-f32.json --bind T=8390000 --explain
grep -i "grid" /tmp/c.log | head -3
echo "checks fail=$fail"
exit "$fail"
