// A parser for PyTorch's function schema notation (the subset native_functions.yaml
// uses for our ops): `name[.overload](Type[(a!)][[]][?] name[=default], *, ...) -> returns`.

#include <cctype>
#include <sstream>

#include "sdpa/registry.h"

namespace sdpa {
namespace {

class SchemaParser {
 public:
  explicit SchemaParser(std::string_view text) : text_(text) {}

  FunctionSchema parse() {
    FunctionSchema s;
    s.name = identifier("an op name");
    if (accept('.')) s.overload = identifier("an overload name");
    expect('(');
    bool kwarg_only = false;
    skip_space();
    if (!accept(')')) {
      while (true) {
        skip_space();
        if (accept('*')) {
          fail_if(kwarg_only, "a second '*'");
          kwarg_only = true;
        } else {
          SchemaArgument a = argument(/*is_return=*/false);
          a.kwarg_only = kwarg_only;
          s.arguments.push_back(std::move(a));
        }
        skip_space();
        if (accept(')')) break;
        expect(',');
      }
    }
    skip_space();
    expect('-');
    expect('>');
    skip_space();
    if (accept('(')) {
      skip_space();
      if (!accept(')')) {
        while (true) {
          s.returns.push_back(argument(/*is_return=*/true));
          skip_space();
          if (accept(')')) break;
          expect(',');
        }
      }
    } else {
      s.returns.push_back(argument(/*is_return=*/true));
    }
    skip_space();
    fail_if(pos_ != text_.size(), "text after the returns");
    return s;
  }

 private:
  SchemaArgument argument(bool is_return) {
    SchemaArgument a;
    skip_space();
    a.type = identifier("a type");
    if (accept('(')) {
      a.alias_set = identifier("an alias set");
      a.is_write = accept('!');
      expect(')');
    }
    if (accept('[')) {
      expect(']');
      a.type += "[]";
    }
    a.optional = accept('?');
    skip_space();
    if (pos_ < text_.size() && is_ident_char(text_[pos_])) a.name = identifier("a name");
    fail_if(!is_return && a.name.empty(), "an argument without a name");
    skip_space();
    if (!is_return && accept('=')) {
      const size_t start = pos_;
      int depth = 0;
      while (pos_ < text_.size()) {
        const char c = text_[pos_];
        if (c == '[' || c == '(') ++depth;
        if ((c == ']' || c == ')') && depth-- == 0) break;
        if (c == ',' && depth == 0) break;
        ++pos_;
      }
      a.default_value = trim(text_.substr(start, pos_ - start));
      fail_if(a.default_value.empty(), "an empty default value");
    }
    return a;
  }

  static bool is_ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  }

  static std::string trim(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return std::string(s);
  }

  std::string identifier(const char* what) {
    skip_space();
    const size_t start = pos_;
    while (pos_ < text_.size() && is_ident_char(text_[pos_])) ++pos_;
    if (pos_ == start) error(std::string("expected ") + what);
    return std::string(text_.substr(start, pos_ - start));
  }

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  bool accept(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    skip_space();
    if (!accept(c)) error(std::string("expected '") + c + "'");
  }

  void fail_if(bool cond, const char* what) {
    if (cond) error(std::string("unexpected ") + what);
  }

  [[noreturn]] void error(const std::string& what) const {
    detail::throw_error("schema: ", what, " at position ", pos_, " in '", text_, "'");
  }

  std::string_view text_;
  size_t pos_ = 0;
};

void print_argument(std::ostream& os, const SchemaArgument& a) {
  const bool list = a.type.size() > 2 && a.type.ends_with("[]");
  os << (list ? a.type.substr(0, a.type.size() - 2) : a.type);
  if (!a.alias_set.empty()) os << '(' << a.alias_set << (a.is_write ? "!" : "") << ')';
  if (list) os << "[]";
  if (a.optional) os << '?';
  if (!a.name.empty()) os << ' ' << a.name;
  if (!a.default_value.empty()) os << '=' << a.default_value;
}

}  // namespace

FunctionSchema parse_schema(std::string_view schema) { return SchemaParser(schema).parse(); }

std::string FunctionSchema::full_name() const {
  return overload.empty() ? name : name + "." + overload;
}

std::string FunctionSchema::functional_name() const {
  if (is_inplace()) return name.substr(0, name.size() - 1);
  return name;
}

std::string FunctionSchema::to_string() const {
  std::ostringstream os;
  os << full_name() << '(';
  bool kwarg_only = false;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (i > 0) os << ", ";
    if (arguments[i].kwarg_only && !kwarg_only) {
      os << "*, ";
      kwarg_only = true;
    }
    print_argument(os, arguments[i]);
  }
  os << ") -> ";
  if (returns.size() == 1 && returns[0].name.empty()) {
    print_argument(os, returns[0]);
  } else {
    os << '(';
    for (size_t i = 0; i < returns.size(); ++i) {
      if (i > 0) os << ", ";
      print_argument(os, returns[i]);
    }
    os << ')';
  }
  return os.str();
}

}  // namespace sdpa
