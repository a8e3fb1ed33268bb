// Tracing mods into programs: linearization, type checks, structural hashing, the
// compiled-form cache and the float64 reference evaluator.

#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "flex/eval_scalar.h"
#include "flex/node.h"
#include "sdpa/error.h"

namespace sdpa::flex {

const char* op_name(Op op) {
  switch (op) {
    case Op::kScore: return "score";
    case Op::kBatch: return "b";
    case Op::kHead: return "h";
    case Op::kQIdx: return "q_idx";
    case Op::kKvIdx: return "kv_idx";
    case Op::kConst: return "const";
    case Op::kRead: return "read";
    case Op::kAdd: return "add";
    case Op::kSub: return "sub";
    case Op::kMul: return "mul";
    case Op::kDiv: return "div";
    case Op::kMod: return "mod";
    case Op::kFloorDiv: return "floordiv";
    case Op::kNeg: return "neg";
    case Op::kMin: return "min";
    case Op::kMax: return "max";
    case Op::kAbs: return "abs";
    case Op::kExp: return "exp";
    case Op::kLog: return "log";
    case Op::kTanh: return "tanh";
    case Op::kSigmoid: return "sigmoid";
    case Op::kSqrt: return "sqrt";
    case Op::kToFloat: return "float";
    case Op::kFloor: return "floor";
    case Op::kCeil: return "ceil";
    case Op::kSin: return "sin";
    case Op::kCos: return "cos";
    case Op::kBitAnd: return "bitwise_and";
    case Op::kBitOr: return "bitwise_or";
    case Op::kBitXor: return "bitwise_xor";
    case Op::kBitNot: return "bitwise_not";
    case Op::kShl: return "left_shift";
    case Op::kShr: return "right_shift";
    case Op::kLt: return "lt";
    case Op::kLe: return "le";
    case Op::kGt: return "gt";
    case Op::kGe: return "ge";
    case Op::kEq: return "eq";
    case Op::kNe: return "ne";
    case Op::kAnd: return "and";
    case Op::kOr: return "or";
    case Op::kNot: return "not";
    case Op::kWhere: return "where";
  }
  return "?";
}

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  // 64-bit hash combine (splitmix64 finalizer over the running state).
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  return h;
}

struct Linearizer {
  std::vector<Instr> code;
  std::vector<Captured> captured;
  std::unordered_map<const Node*, int32_t> index_of;
  std::unordered_map<const CapturedData*, int32_t> slot_of;

  int32_t visit(const std::shared_ptr<const Node>& node) {
    if (auto it = index_of.find(node.get()); it != index_of.end()) return it->second;
    Instr instr{node->op, node->type, {}, node->constant, -1, false};
    for (const auto& arg : node->args) instr.args.push_back(visit(arg));
    if (node->op == Op::kRead) {
      auto [it, fresh] = slot_of.try_emplace(node->captured.get(),
                                             static_cast<int32_t>(captured.size()));
      if (fresh) captured.push_back(captured_from(node->captured));
      instr.slot = it->second;
    }
    bool uniform = node->op != Op::kScore && node->op != Op::kKvIdx;
    for (int32_t a : instr.args) uniform = uniform && code[a].uniform;
    instr.uniform = uniform;
    code.push_back(std::move(instr));
    const auto id = static_cast<int32_t>(code.size() - 1);
    index_of.emplace(node.get(), id);
    return id;
  }

  static Captured captured_from(const std::shared_ptr<const CapturedData>& data) {
    return Captured(data);
  }
};

uint64_t structural_hash(const std::vector<Instr>& code, const std::vector<Captured>& captured,
                         bool is_mask) {
  uint64_t h = mix(0, is_mask ? 1 : 2);
  for (const Instr& in : code) {
    h = mix(h, static_cast<uint64_t>(in.op) << 8 | static_cast<uint64_t>(in.type));
    uint64_t bits;
    std::memcpy(&bits, &in.constant, sizeof bits);
    h = mix(h, bits);
    for (int32_t a : in.args) h = mix(h, static_cast<uint64_t>(a));
    if (in.slot >= 0) {
      const Tensor& t = captured[in.slot].tensor();
      h = mix(h, static_cast<uint64_t>(in.slot));
      h = mix(h, static_cast<uint64_t>(t.dtype()));
      for (int64_t s : t.sizes()) h = mix(h, static_cast<uint64_t>(s));
    }
  }
  return h;
}

std::string render(const std::vector<Instr>& code, const std::vector<Captured>& captured,
                   int32_t result) {
  std::ostringstream os;
  for (size_t i = 0; i < code.size(); ++i) {
    const Instr& in = code[i];
    os << '%' << i << " = " << op_name(in.op);
    if (in.op == Op::kConst) os << ' ' << in.constant;
    if (in.op == Op::kRead) {
      const Captured& c = captured[in.slot];
      os << ' ' << c.name() << shape_str(c.tensor().sizes());
    }
    for (int32_t a : in.args) os << " %" << a;
    os << (in.uniform ? "" : "  (per key)") << '\n';
  }
  os << "return %" << result << '\n';
  return os.str();
}

std::mutex g_cache_mutex;
std::unordered_map<uint64_t, std::shared_ptr<const CompiledProgram>>& cache() {
  static std::unordered_map<uint64_t, std::shared_ptr<const CompiledProgram>> c;
  return c;
}

}  // namespace

std::shared_ptr<const CompiledProgram> compile(const Expr& root, bool is_mask,
                                               std::vector<Captured>* captured) {
  const ValueType want = is_mask ? ValueType::kBool : ValueType::kFloat;
  Expr result = root;
  if (!is_mask && root.type() == ValueType::kInt) result = to_float(root);
  SDPA_CHECK(result.type() == want, "flex: ", is_mask ? "mask_mod" : "score_mod",
             " must return ", is_mask ? "bool" : "a number", ", got ",
             result.type() == ValueType::kBool ? "bool" : "a number");
  Linearizer lin;
  const int32_t out = lin.visit(result.node());
  const uint64_t hash = structural_hash(lin.code, lin.captured, is_mask);
  *captured = lin.captured;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (auto it = cache().find(hash); it != cache().end()) return it->second;
  auto compiled = std::make_shared<CompiledProgram>();
  compiled->code = std::move(lin.code);
  compiled->result = out;
  compiled->is_mask = is_mask;
  for (const Instr& in : compiled->code) {
    compiled->uses_score |= in.op == Op::kScore;
    compiled->uses_batch |= in.op == Op::kBatch;
    compiled->uses_head |= in.op == Op::kHead;
    compiled->uses_q |= in.op == Op::kQIdx;
    compiled->uses_kv |= in.op == Op::kKvIdx;
  }
  compiled->outputs = {out};
  compiled->hash = hash;
  cache().emplace(hash, compiled);
  return compiled;
}

std::shared_ptr<const CompiledProgram> compile_outputs(const std::vector<Expr>& roots,
                                                       std::vector<Captured>* captured) {
  Linearizer lin;
  auto compiled = std::make_shared<CompiledProgram>();
  for (const Expr& r : roots) compiled->outputs.push_back(lin.visit(r.node()));
  compiled->code = std::move(lin.code);
  compiled->result = compiled->outputs.empty() ? -1 : compiled->outputs.front();
  for (const Instr& in : compiled->code) {
    compiled->uses_score |= in.op == Op::kScore;
    compiled->uses_kv |= in.op == Op::kKvIdx;
  }
  compiled->hash = structural_hash(compiled->code, lin.captured, false);
  *captured = lin.captured;
  return compiled;
}

Program Program::from_score_mod(const ScoreMod& mod) {
  return from_expr(mod(input(Op::kScore), input(Op::kBatch), input(Op::kHead),
                       input(Op::kQIdx), input(Op::kKvIdx)),
                   false);
}

Program Program::from_mask_mod(const MaskMod& mod) {
  return from_expr(
      mod(input(Op::kBatch), input(Op::kHead), input(Op::kQIdx), input(Op::kKvIdx)), true);
}

Program Program::from_expr(const Expr& root, bool is_mask) {
  Program p;
  p.compiled_ = compile(root, is_mask, &p.captured_);
  p.root_ = root.node();
  return p;
}

bool Program::is_mask() const { return compiled_->is_mask; }
bool Program::uses_score() const { return compiled_->uses_score; }
uint64_t Program::structural_hash() const { return compiled_->hash; }
std::string Program::to_string() const {
  return render(compiled_->code, captured_, compiled_->result);
}
const std::vector<Captured>& Program::captured() const { return captured_; }

double Program::evaluate(double score, int64_t b, int64_t h, int64_t q_idx,
                         int64_t kv_idx) const {
  require_captured_on(*this, Device{}, "Program::evaluate");
  ScalarEvaluator eval(*compiled_, captured_);
  return eval.run(score, b, h, q_idx, kv_idx);
}

void require_captured_on(const Program& program, Device device, const char* what) {
  for (const Captured& c : program.captured()) {
    const Device d = c.tensor().device();
    const bool ok = d.type == DeviceType::kCPU ||
                    (device.type == DeviceType::kCUDA && d == device);
    SDPA_CHECK(ok, "flex: captured tensor '", c.name(), "' is on ", device_name(d), "; ", what,
               " reads captured tensors on cpu",
               device.type == DeviceType::kCUDA ? " or " + device_name(device) : std::string());
  }
}

}  // namespace sdpa::flex
