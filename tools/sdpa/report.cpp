#include "report.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace sdpa::cli {
namespace {

std::string cell_text(const Cell& cell, int precision) {
  std::ostringstream os;
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, double>) {
          os << std::fixed << std::setprecision(precision) << value;
        } else if constexpr (std::is_same_v<T, bool>) {
          os << (value ? "true" : "false");
        } else {
          os << value;
        }
      },
      cell);
  return os.str();
}

// RFC 4180: quote fields holding a separator, quote or line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// Groups skipped rows by (backend, reason): most reasons (a backend not built) hold for
// every case, and one line says so instead of one line per case.
void write_skipped(const std::vector<SkippedRow>& skipped, size_t num_cases, std::ostream& os) {
  if (skipped.empty()) return;
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> groups;
  std::vector<std::pair<std::string, std::string>> order;  // first-seen order
  for (const SkippedRow& s : skipped) {
    auto& cases = groups[{s.backend, s.reason}];
    if (cases.empty()) order.emplace_back(s.backend, s.reason);
    cases.push_back(s.what);
  }
  os << "\nskipped:\n";
  for (const auto& key : order) {
    const std::vector<std::string>& cases = groups[key];
    const bool every_case = cases.size() == num_cases && num_cases > 1;
    os << "  " << key.first << (every_case ? " (every case): " : ": ") << key.second << '\n';
    if (every_case) continue;
    for (const std::string& c : cases) os << "    " << c << '\n';
  }
}

void write_table(const Report& r, std::ostream& os) {
  write_context(r, "# ", os);
  std::vector<std::vector<std::string>> text;
  std::vector<size_t> width;
  for (const Column& c : r.columns) width.push_back(c.name.size());
  for (const auto& row : r.rows) {
    auto& line = text.emplace_back();
    for (size_t i = 0; i < row.size(); ++i) {
      line.push_back(cell_text(row[i], r.columns[i].precision));
      width[i] = std::max(width[i], line.back().size());
    }
  }
  // Text cells (names) read best left-aligned, numbers right-aligned.
  auto emit = [&](const std::vector<std::string>& line, const std::vector<Cell>* row) {
    for (size_t i = 0; i < line.size(); ++i) {
      const bool left = row == nullptr || std::holds_alternative<std::string>((*row)[i]);
      os << (i ? "  " : "") << (left ? std::left : std::right)
         << std::setw(static_cast<int>(width[i])) << line[i];
    }
    os << std::right << '\n';
  };
  std::vector<std::string> header;
  for (const Column& c : r.columns) header.push_back(c.name);
  emit(header, nullptr);
  for (size_t i = 0; i < text.size(); ++i) emit(text[i], &r.rows[i]);
  write_skipped(r.skipped, r.num_cases, os);
}

void write_csv(const Report& r, std::ostream& os) {
  for (size_t i = 0; i < r.columns.size(); ++i) os << (i ? "," : "") << csv_field(r.columns[i].name);
  os << '\n';
  for (const auto& row : r.rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      // Full precision: CSV is for machines.
      os << (i ? "," : "")
         << csv_field(std::holds_alternative<double>(row[i]) ? nlohmann::json(std::get<double>(row[i])).dump()
                                                             : cell_text(row[i], 0));
    }
    os << '\n';
  }
}

void write_json(const Report& r, std::ostream& os) {
  nlohmann::ordered_json out;
  out["context"] = nlohmann::ordered_json::object();
  for (const ContextItem& item : r.context) {
    std::visit([&](const auto& v) { out["context"][item.key] = v; }, item.value);
  }
  out["results"] = nlohmann::ordered_json::array();
  for (const auto& row : r.rows) {
    nlohmann::ordered_json item;
    for (size_t i = 0; i < row.size(); ++i) {
      std::visit([&](const auto& value) { item[r.columns[i].name] = value; }, row[i]);
    }
    out["results"].push_back(std::move(item));
  }
  out["skipped"] = nlohmann::ordered_json::array();
  for (const SkippedRow& s : r.skipped) {
    out["skipped"].push_back({{"what", s.what}, {"backend", s.backend}, {"reason", s.reason}});
  }
  os << out.dump(2) << '\n';
}

}  // namespace

void write_context(const Report& report, std::string_view prefix, std::ostream& os) {
  for (const auto& [key, value] : report.context) {
    os << prefix << key << ": " << cell_text(value, 1) << '\n';
  }
}

void write_report(const Report& report, ReportFormat format, std::ostream& os) {
  switch (format) {
    case ReportFormat::kTable: return write_table(report, os);
    case ReportFormat::kCsv: return write_csv(report, os);
    case ReportFormat::kJson: return write_json(report, os);
  }
}

}  // namespace sdpa::cli
