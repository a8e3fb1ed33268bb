// Cost of masks, biases and flex programs relative to plain attention, measured as
// ratios in one run (interleaved timing). Checks the targets of docs/benchmarks.md:
//   causal <= 0.6x non-causal (L=S=4096); sliding window 256 and documents of 512 at
//   L=S=8192 <= 1.5x (kept fraction x dense time); ALiBi bias <= 1.15x plain;
//   ALiBi and soft-capping as flex score_mods <= 1.2x plain; flex block-sparse masks
//   <= 1.3x density x dense time.
// Usage: sdpa_mask_ratios [rounds] [--json FILE]   (B=1, H=16, E=64, float32, FLASH_ATTENTION)

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.h"
#include "host.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"

using namespace sdpa;

namespace {

struct Row {
  std::string name;
  double ratio;
  double target;
  std::string what;
};

void print(const Row& r) {
  std::printf("%-34s %7.3f  target <= %-5.2f %-4s  (%s)\n", r.name.c_str(), r.ratio, r.target,
              r.ratio <= r.target ? "ok" : "MISS", r.what.c_str());
}

// Fraction of (query, key) pairs a mask keeps.
double kept_fraction(const AttnBias& bias, int64_t L, int64_t S) {
  const Tensor m = bias.materialize({1, 1, L, S}, DType::kFloat32).expand({1, 1, L, S});
  int64_t kept = 0;
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = 0; j < S; ++j) kept += m.item({0, 0, i, j}) != 0.0 ? 1 : 0;
  }
  return static_cast<double>(kept) / static_cast<double>(L * S);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = bench::command_line(argc, argv);
  const std::string json_path = bench::take_json_path(argc, argv);
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int64_t B = 1, H = 16, E = 64;
  nlohmann::ordered_json measured;  // plain times, kept fractions, block densities
  sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  std::printf("FLASH_ATTENTION, B=%ld H=%ld E=%ld float32, %d rounds, capability %s\n", B, H, E,
              rounds, backends::cpu::get_cpu_capability().c_str());
  std::vector<Row> rows;
  {
    const int64_t L = 4096;
    const Tensor q = bench::randn({B, H, L, E}, DType::kFloat32, 1);
    const Tensor k = bench::randn({B, H, L, E}, DType::kFloat32, 2);
    const Tensor v = bench::randn({B, H, L, E}, DType::kFloat32, 3);
    SDPAOptions causal;
    causal.is_causal = true;
    SDPAOptions alibi;
    alibi.attn_mask = std::make_shared<AlibiBias>(H);
    std::vector<float> slopes = alibi_slopes(H);
    const Tensor slope_tensor = Tensor::from_blob(slopes.data(), {H}, {1}, DType::kFloat32);
    const flex::Program alibi_mod = flex::Program::from_score_mod(flex::mods::alibi(slope_tensor));
    const flex::Program softcap_mod = flex::Program::from_score_mod(flex::mods::soft_cap(20.0));
    const auto t = bench::paired_median_ms(
        {[&] { scaled_dot_product_attention(q, k, v); },
         [&] { scaled_dot_product_attention(q, k, v, causal); },
         [&] { scaled_dot_product_attention(q, k, v, alibi); },
         [&] { flex_attention(q, k, v, alibi_mod); },
         [&] { flex_attention(q, k, v, softcap_mod); }},
        rounds);
    std::printf("L=S=%ld plain %.1f ms\n", L, t[0]);
    measured["plain_ms_4096"] = t[0];
    rows.push_back({"causal / plain (L=4096)", t[1] / t[0], 0.6, "is_causal"});
    rows.push_back({"ALiBi bias / plain (L=4096)", t[2] / t[0], 1.15, "AlibiBias"});
    rows.push_back({"flex ALiBi / plain (L=4096)", t[3] / t[0], 1.2, "score_mod"});
    rows.push_back({"flex soft-cap / plain (L=4096)", t[4] / t[0], 1.2, "score_mod"});
  }
  {
    const int64_t L = 8192;
    const Tensor q = bench::randn({B, H, L, E}, DType::kFloat32, 4);
    const Tensor k = bench::randn({B, H, L, E}, DType::kFloat32, 5);
    const Tensor v = bench::randn({B, H, L, E}, DType::kFloat32, 6);
    auto window = std::make_shared<LocalAttentionBias>(256, 0);
    std::vector<int64_t> lengths(L / 512, 512);
    auto documents = BlockDiagonalBias::from_seqlens(lengths, {}, true);
    SDPAOptions window_opt, doc_opt;
    window_opt.attn_mask = window;
    doc_opt.attn_mask = documents;
    const flex::BlockMask window_blocks =
        flex::create_block_mask(flex::mods::sliding_window(256), 1, 1, L, L);
    Tensor doc_ids = Tensor::empty({L}, DType::kInt64);
    for (int64_t i = 0; i < L; ++i) doc_ids.data<int64_t>()[i] = i / 512;
    const flex::BlockMask doc_blocks = flex::create_block_mask(
        flex::and_masks({flex::mods::document(doc_ids), flex::mods::causal()}), 1, 1, L, L);
    const auto t = bench::paired_median_ms(
        {[&] { scaled_dot_product_attention(q, k, v); },
         [&] { scaled_dot_product_attention(q, k, v, window_opt); },
         [&] { scaled_dot_product_attention(q, k, v, doc_opt); },
         [&] { flex_attention(q, k, v, std::nullopt, &window_blocks); },
         [&] { flex_attention(q, k, v, std::nullopt, &doc_blocks); }},
        rounds);
    const double window_kept = kept_fraction(*window, L, L);
    const double doc_kept = kept_fraction(*documents, L, L);
    std::printf("L=S=%ld plain %.1f ms; kept fraction: window %.4f, documents %.4f; block "
                "density: window %.4f, documents %.4f\n",
                L, t[0], window_kept, doc_kept, window_blocks.density(), doc_blocks.density());
    measured["plain_ms_8192"] = t[0];
    measured["kept_fraction_window"] = window_kept;
    measured["kept_fraction_documents"] = doc_kept;
    measured["block_density_window"] = window_blocks.density();
    measured["block_density_documents"] = doc_blocks.density();
    rows.push_back({"window 256 / (kept x plain)", t[1] / (window_kept * t[0]), 1.5,
                    "LocalAttentionBias, L=8192"});
    rows.push_back({"documents 512 / (kept x plain)", t[2] / (doc_kept * t[0]), 1.5,
                    "BlockDiagonalBias causal, L=8192"});
    rows.push_back({"flex window / (density x plain)", t[3] / (window_blocks.density() * t[0]),
                    1.3, "BlockMask sliding_window(256)"});
    rows.push_back({"flex documents / (density x plain)", t[4] / (doc_blocks.density() * t[0]),
                    1.3, "BlockMask document & causal"});
  }
  for (const Row& r : rows) print(r);
  if (json_path.empty()) return 0;
  nlohmann::ordered_json ratios = nlohmann::ordered_json::array();
  for (const Row& r : rows) {
    ratios.push_back({{"case", r.name},
                      {"ratio", r.ratio},
                      {"target_max", r.target},
                      {"meets_target", r.ratio <= r.target},
                      {"what", r.what}});
  }
  measured["ratios"] = std::move(ratios);
  const nlohmann::ordered_json config = {{"backend", "FLASH_ATTENTION"}, {"batch", B},
                                         {"heads", H},  {"head_dim", E},
                                         {"dtype", "float32"}, {"rounds", rounds}};
  return bench::write_json(json_path, "mask_ratios", command, config, measured) ? 0 : 1;
}
