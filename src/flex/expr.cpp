// Expression construction: operator overloading builds typed nodes.

#include <cmath>
#include <utility>

#include "flex/node.h"
#include "sdpa/error.h"

namespace sdpa::flex {
namespace {

const char* type_name(ValueType t) {
  switch (t) {
    case ValueType::kFloat: return "float";
    case ValueType::kInt: return "int";
    case ValueType::kBool: return "bool";
  }
  return "?";
}

Expr make(Op op, ValueType type, std::vector<Expr> args) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->type = type;
  for (const Expr& a : args) n->args.push_back(a.node());
  return Expr(std::shared_ptr<const Node>(std::move(n)));
}

Expr constant(double value, ValueType type) {
  auto n = std::make_shared<Node>();
  n->op = Op::kConst;
  n->type = type;
  n->constant = value;
  return Expr(std::shared_ptr<const Node>(std::move(n)));
}

void expect_numeric(const char* op, const Expr& a) {
  SDPA_CHECK(a.type() != ValueType::kBool, "flex: '", op, "' expects int or float operands, got ",
             type_name(a.type()));
}

void expect_bool(const char* op, const Expr& a) {
  SDPA_CHECK(a.type() == ValueType::kBool, "flex: '", op, "' expects bool operands, got ",
             type_name(a.type()));
}

ValueType promote(const Expr& a, const Expr& b) {
  return a.type() == ValueType::kFloat || b.type() == ValueType::kFloat ? ValueType::kFloat
                                                                        : ValueType::kInt;
}

// Converts both operands to their common type, so evaluators never mix lane types.
std::pair<Expr, Expr> promoted(const Expr& a, const Expr& b) {
  if (promote(a, b) == ValueType::kFloat) return {to_float(a), to_float(b)};
  return {a, b};
}

Expr arithmetic(Op op, const char* name, const Expr& a, const Expr& b) {
  expect_numeric(name, a);
  expect_numeric(name, b);
  const auto [x, y] = promoted(a, b);
  return make(op, x.type(), {x, y});
}

Expr integer_op(Op op, const char* name, const Expr& a, const Expr& b) {
  SDPA_CHECK(a.type() == ValueType::kInt && b.type() == ValueType::kInt, "flex: '", name,
             "' expects int operands, got ", type_name(a.type()), " and ", type_name(b.type()));
  return make(op, ValueType::kInt, {a, b});
}

Expr compare(Op op, const char* name, const Expr& a, const Expr& b) {
  if (a.type() == ValueType::kBool || b.type() == ValueType::kBool) {
    SDPA_CHECK((op == Op::kEq || op == Op::kNe) && a.type() == b.type(), "flex: '", name,
               "' cannot compare ", type_name(a.type()), " with ", type_name(b.type()));
    return make(op, ValueType::kBool, {a, b});
  }
  const auto [x, y] = promoted(a, b);
  return make(op, ValueType::kBool, {x, y});
}

Expr unary_float(Op op, const char* name, const Expr& a) {
  expect_numeric(name, a);
  const Expr x = a.type() == ValueType::kFloat ? a : to_float(a);
  return make(op, ValueType::kFloat, {x});
}

}  // namespace

Expr::Expr(double value) : Expr(constant(value, ValueType::kFloat)) {}
Expr::Expr(float value) : Expr(constant(value, ValueType::kFloat)) {}
Expr::Expr(int value) : Expr(constant(value, ValueType::kInt)) {}
Expr::Expr(int64_t value) : Expr(constant(static_cast<double>(value), ValueType::kInt)) {}
Expr::Expr(bool value) : Expr(constant(value ? 1.0 : 0.0, ValueType::kBool)) {}
ValueType Expr::type() const { return node_->type; }

Expr input(Op op) {
  return make(op, op == Op::kScore ? ValueType::kFloat : ValueType::kInt, {});
}

Expr operator+(const Expr& a, const Expr& b) { return arithmetic(Op::kAdd, "+", a, b); }
Expr operator-(const Expr& a, const Expr& b) { return arithmetic(Op::kSub, "-", a, b); }
Expr operator*(const Expr& a, const Expr& b) { return arithmetic(Op::kMul, "*", a, b); }
Expr operator/(const Expr& a, const Expr& b) {
  expect_numeric("/", a);
  expect_numeric("/", b);
  return make(Op::kDiv, ValueType::kFloat, {to_float(a), to_float(b)});
}
Expr operator%(const Expr& a, const Expr& b) { return integer_op(Op::kMod, "%", a, b); }
Expr floor_div(const Expr& a, const Expr& b) { return integer_op(Op::kFloorDiv, "//", a, b); }
Expr operator-(const Expr& a) {
  expect_numeric("neg", a);
  return make(Op::kNeg, a.type(), {a});
}
Expr operator<(const Expr& a, const Expr& b) { return compare(Op::kLt, "<", a, b); }
Expr operator<=(const Expr& a, const Expr& b) { return compare(Op::kLe, "<=", a, b); }
Expr operator>(const Expr& a, const Expr& b) { return compare(Op::kGt, ">", a, b); }
Expr operator>=(const Expr& a, const Expr& b) { return compare(Op::kGe, ">=", a, b); }
Expr operator==(const Expr& a, const Expr& b) { return compare(Op::kEq, "==", a, b); }
Expr operator!=(const Expr& a, const Expr& b) { return compare(Op::kNe, "!=", a, b); }
Expr operator&(const Expr& a, const Expr& b) {
  if (a.type() == ValueType::kInt || b.type() == ValueType::kInt) {
    return integer_op(Op::kBitAnd, "&", a, b);
  }
  return a && b;
}
Expr operator|(const Expr& a, const Expr& b) {
  if (a.type() == ValueType::kInt || b.type() == ValueType::kInt) {
    return integer_op(Op::kBitOr, "|", a, b);
  }
  return a || b;
}
Expr operator^(const Expr& a, const Expr& b) {
  if (a.type() == ValueType::kInt || b.type() == ValueType::kInt) {
    return integer_op(Op::kBitXor, "^", a, b);
  }
  expect_bool("^", a);
  expect_bool("^", b);
  return make(Op::kNe, ValueType::kBool, {a, b});
}
Expr operator<<(const Expr& a, const Expr& b) { return integer_op(Op::kShl, "<<", a, b); }
Expr operator>>(const Expr& a, const Expr& b) { return integer_op(Op::kShr, ">>", a, b); }
Expr operator&&(const Expr& a, const Expr& b) {
  expect_bool("&&", a);
  expect_bool("&&", b);
  return make(Op::kAnd, ValueType::kBool, {a, b});
}
Expr operator||(const Expr& a, const Expr& b) {
  expect_bool("||", a);
  expect_bool("||", b);
  return make(Op::kOr, ValueType::kBool, {a, b});
}
Expr operator!(const Expr& a) {
  expect_bool("!", a);
  return make(Op::kNot, ValueType::kBool, {a});
}
Expr operator~(const Expr& a) {
  if (a.type() == ValueType::kInt) return make(Op::kBitNot, ValueType::kInt, {a});
  return !a;
}

Expr where(const Expr& cond, const Expr& a, const Expr& b) {
  expect_bool("where", cond);
  if (a.type() == ValueType::kBool || b.type() == ValueType::kBool) {
    SDPA_CHECK(a.type() == b.type(), "flex: 'where' cannot mix bool with ", type_name(a.type()),
               "/", type_name(b.type()));
    return make(Op::kWhere, ValueType::kBool, {cond, a, b});
  }
  const ValueType t = promote(a, b);
  const Expr x = t == ValueType::kFloat ? to_float(a) : a;
  const Expr y = t == ValueType::kFloat ? to_float(b) : b;
  return make(Op::kWhere, t, {cond, x, y});
}
Expr minimum(const Expr& a, const Expr& b) { return arithmetic(Op::kMin, "minimum", a, b); }
Expr maximum(const Expr& a, const Expr& b) { return arithmetic(Op::kMax, "maximum", a, b); }
Expr abs(const Expr& a) {
  expect_numeric("abs", a);
  return make(Op::kAbs, a.type(), {a});
}
Expr exp(const Expr& a) { return unary_float(Op::kExp, "exp", a); }
Expr log(const Expr& a) { return unary_float(Op::kLog, "log", a); }
Expr tanh(const Expr& a) { return unary_float(Op::kTanh, "tanh", a); }
Expr sigmoid(const Expr& a) { return unary_float(Op::kSigmoid, "sigmoid", a); }
Expr sqrt(const Expr& a) { return unary_float(Op::kSqrt, "sqrt", a); }
Expr sin(const Expr& a) { return unary_float(Op::kSin, "sin", a); }
Expr cos(const Expr& a) { return unary_float(Op::kCos, "cos", a); }
Expr floor(const Expr& a) {
  expect_numeric("floor", a);
  return a.type() == ValueType::kInt ? a : make(Op::kFloor, ValueType::kFloat, {a});
}
Expr ceil(const Expr& a) {
  expect_numeric("ceil", a);
  return a.type() == ValueType::kInt ? a : make(Op::kCeil, ValueType::kFloat, {a});
}
Expr to_float(const Expr& a) {
  if (a.type() == ValueType::kFloat) return a;
  return make(Op::kToFloat, ValueType::kFloat, {a});
}

Captured::Captured(std::string name, Tensor tensor, bool requires_grad) {
  SDPA_CHECK(tensor.defined(), "flex: captured tensor '", name, "' is undefined");
  SDPA_CHECK(tensor.device().type == DeviceType::kCPU || tensor.device().type == DeviceType::kCUDA,
             "flex: captured tensor '", name, "' must be on cpu or a CUDA device, got ",
             device_name(tensor.device()));
  SDPA_CHECK(tensor.dim() >= 1 && tensor.dim() <= 8, "flex: captured tensor '", name,
             "' must have 1 to 8 dimensions, got ", tensor.dim());
  SDPA_CHECK(!requires_grad || is_floating(tensor.dtype()), "flex: captured tensor '", name,
             "' requires grad but has dtype ", dtype_name(tensor.dtype()));
  data_ = std::make_shared<CapturedData>(CapturedData{std::move(name), std::move(tensor),
                                                      requires_grad});
}

const std::string& Captured::name() const { return data_->name; }
const Tensor& Captured::tensor() const { return data_->tensor; }
bool Captured::requires_grad() const { return data_->requires_grad; }

Captured::Index Captured::operator[](const Expr& index) const { return Index(data_, {index}); }

Captured::Index Captured::Index::operator[](const Expr& index) const {
  std::vector<Expr> next = indices_;
  next.push_back(index);
  return Index(data_, std::move(next));
}

Expr Captured::operator()(const std::vector<Expr>& indices) const {
  return static_cast<Expr>(Index(data_, indices));
}

Captured::Index::operator Expr() const {
  const Tensor& t = data_->tensor;
  SDPA_CHECK(static_cast<int64_t>(indices_.size()) == t.dim(), "flex: captured tensor '",
             data_->name, "' ", shape_str(t.sizes()), " needs ", t.dim(), " indices, got ",
             indices_.size());
  for (const Expr& i : indices_) {
    SDPA_CHECK(i.type() == ValueType::kInt, "flex: captured tensor '", data_->name,
               "' must be indexed by int expressions, got ", type_name(i.type()));
  }
  auto n = std::make_shared<Node>();
  n->op = Op::kRead;
  n->type = t.dtype() == DType::kBool ? ValueType::kBool
            : is_floating(t.dtype())  ? ValueType::kFloat
                                      : ValueType::kInt;
  n->captured = data_;
  for (const Expr& i : indices_) n->args.push_back(i.node());
  return Expr(std::shared_ptr<const Node>(std::move(n)));
}

}  // namespace sdpa::flex
