#include "common.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <sstream>

#ifndef SDPA_SOURCE_DIR
#error "SDPA_SOURCE_DIR must name the source tree (set in tools/CMakeLists.txt)"
#endif

namespace sdpa::cli {
namespace {

// A bound as text; a type's largest value as "2^31 - 1" rather than its ten or more digits.
template <class T>
std::string bound_text(T value) {
  if (value == std::numeric_limits<T>::max()) {
    return "2^" + std::to_string(std::numeric_limits<T>::digits) + " - 1";
  }
  return std::to_string(value);
}

// Shortest text of a real bound: "0", "0.5", "1e-05".
std::string number_text(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

// A validator that accepts what `ok` accepts and otherwise says "expected <what>, got '...'".
CLI::Validator expecting(std::string description, std::string what,
                         std::function<bool(const std::string&)> ok) {
  return CLI::Validator(
      [what = std::move(what), ok = std::move(ok)](std::string& text) -> std::string {
        return ok(text) ? std::string() : "expected " + what + ", got '" + text + "'";
      },
      std::move(description));
}

// The finite number `text` spells exactly, else nullopt.
std::optional<double> parse_number(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE ||
      !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

template <class T>
CLI::Validator integer_in(T min, T max) {
  const bool unbounded = max == std::numeric_limits<T>::max();
  const std::string at_least = "an integer >= " + bound_text(min);
  const std::string from_to = "an integer from " + bound_text(min) + " to " + bound_text(max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        T value{};
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        const bool whole = ec != std::errc::invalid_argument && end == text.data() + text.size();
        if (whole && ec == std::errc() && value >= min && value <= max) return {};
        // Too large (for the flag or its type) names both bounds; anything else the lower.
        const bool too_large =
            whole && (ec == std::errc::result_out_of_range || value > max) && text.front() != '-';
        return "expected " + (too_large || !unbounded ? from_to : at_least) + ", got '" + text +
               "'";
      },
      unbounded ? "INT>=" + bound_text(min)
                : "INT in [" + bound_text(min) + ", " + bound_text(max) + "]");
}
template CLI::Validator integer_in<int>(int, int);
template CLI::Validator integer_in<int64_t>(int64_t, int64_t);
template CLI::Validator integer_in<uint32_t>(uint32_t, uint32_t);

CLI::Validator number_at_least(double min) {
  return expecting("NUM>=" + number_text(min), "a number >= " + number_text(min),
                   [min](const std::string& text) {
                     const auto value = parse_number(text);
                     return value && *value >= min;
                   });
}

CLI::Validator number_above(double min) {
  return expecting("NUM>" + number_text(min), "a number > " + number_text(min),
                   [min](const std::string& text) {
                     const auto value = parse_number(text);
                     return value && *value > min;
                   });
}

CLI::Validator number_in(double min, double max) {
  const std::string range = number_text(min) + " to " + number_text(max);
  return expecting("NUM in [" + number_text(min) + ", " + number_text(max) + "]",
                   "a number from " + range, [min, max](const std::string& text) {
                     const auto value = parse_number(text);
                     return value && *value >= min && *value <= max;
                   });
}

CLI::Validator byte_count() {
  // No description of its own: AsSizeValue's already describes the flag in the help.
  return expecting("", "a byte count from 0 to 2^64 - 1, optionally with a unit (512KiB, 2GiB)",
                   [](const std::string& text) {
                     // The leading count: from_chars rejects a sign and reports overflow;
                     // AsSizeValue reads the unit after it.
                     uint64_t count = 0;
                     return std::from_chars(text.data(), text.data() + text.size(), count).ec ==
                            std::errc();
                   });
}

CLI::Option* add_dtype_option(CLI::App& app, std::string& name) {
  std::vector<std::string> floating;
  for (const DType d : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
    floating.emplace_back(dtype_name(d));
  }
  // The aliases are parse_dtype's; these are examples for the help, not a second table.
  const std::string names = join(floating) + " or a short name such as fp32, bf16, fp16";
  return app.add_option("--dtype", name, "Element type: " + names)
      ->check(CLI::Validator(
          [names](std::string& text) -> std::string {
            try {
              const DType dtype = parse_dtype(text);
              if (is_floating(dtype)) {
                text = std::string(dtype_name(dtype));
                return {};
              }
            } catch (const Error&) {
              // Unknown name: the message below lists what is accepted.
            }
            return "expected a floating dtype (" + names + "), got '" + text + "'";
          },
          "DTYPE"))
      ->capture_default_str();
}

AttentionParams probe_params(DType dtype) {
  const Tensor probe = Tensor::empty({1, 1, 1, 8}, dtype);
  return make_params(probe, probe, probe);
}

CLI::Validator backend_validator() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        try {
          parse_backend(name);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "BACKEND", "backend");
}

std::vector<SDPBackend> parse_backends(const std::vector<std::string>& names) {
  std::vector<SDPBackend> out;
  for (const std::string& name : names) out.push_back(parse_backend(name));
  return out;
}

CLI::Option* add_backends_option(CLI::App& app, std::vector<std::string>& names) {
  return app
      .add_option("--backends", names,
                  "Comma-separated backends to allow (math, flash, efficient, cudnn, "
                  "overrideable); default: all")
      ->delimiter(',')
      ->check(backend_validator());
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

Tensor randn(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  double* d = t.data<double>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) d[i] = normal(gen);
  return dtype == DType::kFloat64 ? t : t.to(dtype);
}

std::vector<double> time_ms(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  times.reserve(static_cast<size_t>(std::max(repeats, 0)));
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return times;
}

double median(std::vector<double> values) {
  SDPA_CHECK(!values.empty(), "median: expected at least one value");
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), mid, values.end());
  return *mid;
}

ErrorStats compare(const Tensor& actual, const Tensor& expected) {
  SDPA_CHECK(actual.sizes() == expected.sizes(), "compare: expected shape ",
             shape_str(expected.sizes()), ", got ", shape_str(actual.sizes()));
  const Tensor a = actual.to(DType::kFloat64);
  const Tensor b = expected.to(DType::kFloat64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double max_abs = 0.0, max_ref = 0.0;
  for (int64_t i = 0, n = a.numel(); i < n; ++i) {
    const double diff = std::abs(pa[i] - pb[i]);
    // A NaN on either side is a failure, not a zero error (std::max would drop it).
    max_abs = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(max_abs, diff);
    if (std::isfinite(pb[i])) max_ref = std::max(max_ref, std::abs(pb[i]));
  }
  ErrorStats stats;
  stats.max_abs = max_abs;
  stats.max_rel = max_abs == 0.0 ? 0.0
                  : max_ref == 0.0 ? std::numeric_limits<double>::infinity()
                                   : max_abs / max_ref;
  return stats;
}

double forward_flops(const AttentionParams& p, bool causal) {
  const double score_elems =
      static_cast<double>(p.batch) * p.num_heads_q * p.q_len * p.kv_len;
  const double flops = 2.0 * score_elems * static_cast<double>(p.head_dim_qk + p.head_dim_vo);
  return causal ? flops / 2.0 : flops;
}

std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (std::abs(value) >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return buf;
}

std::filesystem::path data_file(const std::string& name) {
  if (const char* dir = std::getenv("SDPA_DATA_DIR"); dir != nullptr && *dir != '\0') {
    return std::filesystem::path(dir) / name;
  }
  return std::filesystem::path(SDPA_SOURCE_DIR) / "data" / name;
}

}  // namespace sdpa::cli
