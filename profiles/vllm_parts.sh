#!/usr/bin/env bash
# Here (a machine with PyPI, no GPU): download vLLM 0.24.0 and the dependencies the in-process
# engine needs on the lent GPU machines (../shared/vllm-offline.md lists them), drop what Hopper
# and the in-process engine never load (FlashAttention 2, vllm-rs, Blackwell kernels, deep_gemm
# headers, swagger files), and split the result into carryable parts under .vllm/ (git-ignored):
#   p00.. : one tar of the trimmed tree (.tar.xz) and the dependency wheels
#   m00.. : the mixture-of-experts kernels (_moe_C_stable_libtorch.abi3.so), needed by MoE models
# profiles/device_vllm.sh joins and installs them on the GPU machine. PART_MIB sets the part size
# (profiles/README.md, "Tables through vLLM", says how many a call can carry). Work folder:
# .scratch/vllm-parts (git-ignored; reused: the downloads are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
PART_MIB=${PART_MIB:-8}
W=.scratch/vllm-parts
mkdir -p $W/wheel $W/deps .vllm
PLATFORMS=""
for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_24 \
  manylinux_2_31 manylinux_2_34 manylinux_2_35; do PLATFORMS+=" --platform ${p}_x86_64"; done
dl() {  # dl DEST NAME==VERSION: a cp312 x86-64 wheel, no dependencies
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $PLATFORMS -d "$1" "$2"
}
dl $W/wheel vllm==0.24.0
for p in annotated_types==0.8.0 apache_tvm_ffi==0.1.15.post2 astor==0.8.1 blake3==1.0.11 \
  cachetools==8.0.1 cbor2==6.3.0 compressed_tensors==0.17.0 depyf==0.20.0 dill==0.4.1 \
  diskcache==5.6.3 distro==1.9.0 fastapi==0.136.3 ijson==3.6.0 jiter==0.19.0 lark==1.2.2 \
  llguidance==1.7.6 loguru==0.7.3 msgspec==0.22.0 openai==2.54.0 openai_harmony==0.0.8 \
  partial_json_parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.13.5 pydantic_core==2.46.5 \
  python_json_logger==4.2.0 pyzmq==27.3.0 setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0 \
  typing_extensions==4.16.0 typing_inspection==0.4.5 watchfiles==1.3.0 xgrammar==0.2.8; do
  dl $W/deps "$p"
done
rm -rf $W/tree $W/pack && mkdir -p $W/tree $W/pack
(cd $W/tree && python3 -m zipfile -e ../wheel/vllm-0.24.0-*.whl .)
rm -f $W/tree/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so
rm -rf $W/tree/vllm/third_party/fmha_sm100
find $W/tree \( -name 'vllm-rs*' -o -name 'vllm_rs*' -o -path '*swagger*' \) -prune -exec rm -rf {} +
find $W/tree -path '*deep_gemm*' -name include -type d -prune -exec rm -rf {} +
mv $W/tree/vllm/_moe_C_stable_libtorch.abi3.so $W/moe.so
tar cf - -C $W/tree . | xz -T0 -6 > $W/pack/vllm-trim.tar.xz
cp -r $W/deps $W/pack/deps
tar cf $W/all.tar -C $W/pack vllm-trim.tar.xz deps
tar cf - -C $W --transform 's/moe.so/_moe_C_stable_libtorch.abi3.so/' moe.so | xz -T0 -6 > $W/moe.tar.xz
rm -f .vllm/p[0-9]* .vllm/m[0-9]*
split -b ${PART_MIB}M -d -a 2 $W/all.tar .vllm/p
split -b ${PART_MIB}M -d -a 2 $W/moe.tar.xz .vllm/m
sha256sum $W/all.tar
ls .vllm
