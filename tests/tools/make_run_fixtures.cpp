// Writes small synthetic captures in the `sdpa run` format into the directory argv[1]:
//   layers.safetensors     3 layers of q/k/v [2, 4, 9, 16] float32, a padding attn_mask
//                          [2, 1, 1, 9] (batch 1 sees 6 keys), out from MATH in float64,
//                          metadata scale 0.3 (not the default 1/sqrt(16), so the tool
//                          must read it)
//   single.safetensors     unprefixed q/k/v only (the tool's reference is MATH float64)
//   wrong_out.safetensors  layers.safetensors with layer1.out perturbed by 1e-3
//   missing_v.safetensors  layer0.q and layer0.k only
//   bad_mask.safetensors   layer0 with an attn_mask [2, 1, 1, 5] that does not fit S = 9

#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "sdpa/safetensors.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::DType;
using sdpa::Tensor;

constexpr int64_t kBatch = 2, kHeads = 4, kSeqLen = 9, kHeadDim = 16;
constexpr double kScale = 0.3;

Tensor randn(const sdpa::Shape& shape, std::mt19937& gen) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::normal_distribution<float> normal;
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = normal(gen);
  return t;
}

// [B, 1, 1, S] bool: batch 0 sees every key, batch 1 the first 6 (right padding).
Tensor padding_mask() {
  Tensor mask = Tensor::empty({kBatch, 1, 1, kSeqLen}, DType::kBool);
  bool* m = mask.data<bool>();
  for (int64_t s = 0; s < kSeqLen; ++s) {
    m[s] = true;
    m[kSeqLen + s] = s < 6;
  }
  return mask;
}

Tensor reference_out(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  const sdpa::sdpa_kernel math_only(sdpa::SDPBackend::MATH);
  sdpa::SDPAOptions options;
  options.attn_mask = mask;
  options.scale = kScale;
  return sdpa::scaled_dot_product_attention(q.to(DType::kFloat64), k.to(DType::kFloat64),
                                            v.to(DType::kFloat64), options)
      .to(DType::kFloat32);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    std::mt19937 gen(20240607);
    const sdpa::Shape shape = {kBatch, kHeads, kSeqLen, kHeadDim};

    std::map<std::string, Tensor> layers;
    for (int layer = 0; layer < 3; ++layer) {
      const std::string p = "layer" + std::to_string(layer) + ".";
      const Tensor q = randn(shape, gen), k = randn(shape, gen), v = randn(shape, gen);
      const Tensor mask = padding_mask();
      layers[p + "q"] = q;
      layers[p + "k"] = k;
      layers[p + "v"] = v;
      layers[p + "attn_mask"] = mask;
      layers[p + "out"] = reference_out(q, k, v, mask);
    }
    const sdpa::SafetensorsMetadata metadata = {
        {"model", "synthetic"}, {"layers", "3"}, {"scale", std::to_string(kScale)}};
    sdpa::save_safetensors(dir / "layers.safetensors", layers, metadata);

    std::map<std::string, Tensor> wrong = layers;
    wrong["layer1.out"] = layers["layer1.out"].clone();
    wrong["layer1.out"].data<float>()[5] += 1e-3f;
    sdpa::save_safetensors(dir / "wrong_out.safetensors", wrong, metadata);

    sdpa::save_safetensors(dir / "single.safetensors",
                           {{"q", randn(shape, gen)}, {"k", randn(shape, gen)},
                            {"v", randn(shape, gen)}});
    sdpa::save_safetensors(dir / "missing_v.safetensors",
                           {{"layer0.q", layers["layer0.q"]}, {"layer0.k", layers["layer0.k"]}});
    sdpa::save_safetensors(dir / "bad_mask.safetensors",
                           {{"layer0.q", layers["layer0.q"]}, {"layer0.k", layers["layer0.k"]},
                            {"layer0.v", layers["layer0.v"]},
                            {"layer0.attn_mask", Tensor::full({kBatch, 1, 1, 5}, 1.0, DType::kBool)}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
  return 0;
}
