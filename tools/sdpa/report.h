#pragma once
// A results table written as aligned text, CSV or JSON from one description, so a new
// column (a benchmark flag adding a measurement) appears in every format at once.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace sdpa::cli {

/// One value; JSON keeps its type, text and CSV print it.
using Cell = std::variant<std::string, int64_t, double, bool>;

struct Column {
  std::string name;
  int precision = 3;  ///< digits after the point for double cells (text table only)
};

/// A row that was not measured, and why.
struct SkippedRow {
  std::string what;     ///< e.g. "B=1 Hq=8 Hkv=8 L=S=512 E=64 float64 causal"
  std::string backend;
  std::string reason;
};

/// A key/value line describing the run (version, capability, threads, flags).
struct ContextItem {
  std::string key;
  Cell value;
};

struct Report {
  std::vector<ContextItem> context;
  std::vector<Column> columns;
  std::vector<std::vector<Cell>> rows;  ///< each as long as `columns`
  std::vector<SkippedRow> skipped;
  /// Number of distinct SkippedRow::what values the run had (sweep points), so a reason
  /// that holds for all of them prints once.
  size_t num_cases = 0;
};

enum class ReportFormat { kTable, kCsv, kJson };

/// Writes the context as "<prefix>key: value" lines, doubles with one decimal.
void write_context(const Report& report, std::string_view prefix, std::ostream& os);

/// Writes `report`: kTable as "# key: value" lines, an aligned table and the skipped rows
/// grouped by backend and reason (cases listed unless the reason holds for all of them);
/// kCsv as a header line and one line per row (skipped rows omitted); kJson as
/// {"context": {...}, "results": [{column: value, ...}], "skipped": [...]}, every value a
/// JSON number, boolean or string as its Cell holds.
void write_report(const Report& report, ReportFormat format, std::ostream& os);

}  // namespace sdpa::cli
