// Reverse-mode symbolic differentiation over the traced expression DAG: adjoints are
// themselves expressions, linearized into one multi-output program.

#include "flex/autodiff.h"

#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "sdpa/error.h"

namespace sdpa::flex {
namespace {

using NodePtr = std::shared_ptr<const Node>;

void topological(const NodePtr& n, std::unordered_set<const Node*>& seen,
                 std::vector<NodePtr>& order) {
  if (!seen.insert(n.get()).second) return;
  for (const NodePtr& a : n->args) topological(a, seen, order);
  order.push_back(n);
}

}  // namespace

GradientProgram differentiate(const Program& score_mod) {
  SDPA_CHECK(!score_mod.is_mask(), "flex: expected a score_mod to differentiate, got a mask_mod");
  std::vector<NodePtr> order;
  std::unordered_set<const Node*> seen;
  const Expr root = score_mod.root();
  topological(root.node(), seen, order);

  std::unordered_map<const Node*, Expr> adjoint;
  auto accumulate = [&](const NodePtr& n, const Expr& contribution) {
    if (n->type != ValueType::kFloat) return;  // ints and bools carry no gradient
    auto it = adjoint.find(n.get());
    if (it == adjoint.end()) {
      adjoint.emplace(n.get(), contribution);
    } else {
      it->second = it->second + contribution;
    }
  };
  adjoint.emplace(root.node().get(), Expr(1.0));
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodePtr& n = *it;
    const auto found = adjoint.find(n.get());
    if (found == adjoint.end()) continue;
    const Expr a = found->second;
    const Expr self(n);
    auto arg = [&](int i) { return Expr(n->args[i]); };
    switch (n->op) {
      case Op::kAdd:
        accumulate(n->args[0], a);
        accumulate(n->args[1], a);
        break;
      case Op::kSub:
        accumulate(n->args[0], a);
        accumulate(n->args[1], -a);
        break;
      case Op::kMul:
        accumulate(n->args[0], a * arg(1));
        accumulate(n->args[1], a * arg(0));
        break;
      case Op::kDiv:
        accumulate(n->args[0], a / arg(1));
        accumulate(n->args[1], -a * arg(0) / (arg(1) * arg(1)));
        break;
      case Op::kNeg: accumulate(n->args[0], -a); break;
      case Op::kMin:
        accumulate(n->args[0], where(arg(0) <= arg(1), a, 0.0));
        accumulate(n->args[1], where(arg(0) <= arg(1), 0.0, a));
        break;
      case Op::kMax:
        accumulate(n->args[0], where(arg(0) >= arg(1), a, 0.0));
        accumulate(n->args[1], where(arg(0) >= arg(1), 0.0, a));
        break;
      case Op::kAbs:  // sign(x), 0 at 0 (torch's convention)
        accumulate(n->args[0], where(arg(0) > 0.0, a, where(arg(0) < 0.0, -a, 0.0)));
        break;
      case Op::kExp: accumulate(n->args[0], a * self); break;
      case Op::kLog: accumulate(n->args[0], a / arg(0)); break;
      case Op::kTanh: accumulate(n->args[0], a * (1.0 - self * self)); break;
      case Op::kSigmoid: accumulate(n->args[0], a * self * (1.0 - self)); break;
      case Op::kSqrt: accumulate(n->args[0], a * 0.5 / self); break;
      case Op::kSin: accumulate(n->args[0], a * cos(arg(0))); break;
      case Op::kCos: accumulate(n->args[0], -a * sin(arg(0))); break;
      case Op::kWhere:
        accumulate(n->args[1], where(arg(0), a, 0.0));
        accumulate(n->args[2], where(arg(0), 0.0, a));
        break;
      default: break;  // inputs, constants, reads, floor / ceil, integer and boolean ops
    }
  }

  // A program built from several traced roots (Program::from_expr) has one score input
  // node per root: the gradient with respect to score is the sum over all of them.
  bool uses_score = false;
  std::optional<Expr> d_score;
  for (const NodePtr& n : order) {
    if (n->op != Op::kScore) continue;
    uses_score = true;
    const auto adj = adjoint.find(n.get());
    if (adj != adjoint.end()) d_score = d_score ? *d_score + adj->second : adj->second;
  }
  SDPA_CHECK(uses_score, "flex: score_mod ignores score, so its output does not depend on "
             "q or k and has no gradient for them; use a BlockMask or an AttnBias instead");
  SDPA_CHECK(d_score.has_value(), "flex: score_mod is not differentiable with respect to "
             "score: score reaches the result only through comparisons or integer operations");

  std::vector<Expr> outputs{*d_score};
  std::vector<std::pair<const CapturedData*, size_t>> read_outputs;  // (tensor, first output)
  std::vector<const Node*> reads;
  for (const NodePtr& n : order) {
    if (n->op != Op::kRead || !n->captured->requires_grad) continue;
    const auto adj = adjoint.find(n.get());
    if (adj == adjoint.end()) continue;
    reads.push_back(n.get());
    read_outputs.emplace_back(n->captured.get(), outputs.size());
    outputs.push_back(adj->second);
    for (const NodePtr& index : n->args) outputs.push_back(Expr(index));
  }

  GradientProgram g;
  g.program = compile_outputs(outputs, &g.captured);
  g.d_score = g.program->outputs[0];
  const std::vector<Captured>& forward = score_mod.captured();
  for (size_t r = 0; r < reads.size(); ++r) {
    GradientProgram::ReadGrad rg;
    rg.forward_slot = -1;
    for (size_t s = 0; s < forward.size(); ++s) {
      if (forward[s].data().get() == read_outputs[r].first) rg.forward_slot = static_cast<int32_t>(s);
    }
    SDPA_CHECK(rg.forward_slot >= 0, "flex: internal error: a differentiated read has no "
               "captured slot in its score_mod");
    const size_t first = read_outputs[r].second;
    rg.adjoint = g.program->outputs[first];
    for (size_t d = 0; d < reads[r]->args.size(); ++d) {
      rg.indices.push_back(g.program->outputs[first + 1 + d]);
    }
    g.reads.push_back(std::move(rg));
  }
  return g;
}

CompiledProgram GradientProgram::in_slots_of(const std::vector<Captured>& forward) const {
  CompiledProgram remapped = *program;
  for (Instr& in : remapped.code) {
    if (in.op != Op::kRead) continue;
    const CapturedData* data = captured[static_cast<size_t>(in.slot)].data().get();
    for (size_t f = 0; f < forward.size(); ++f) {
      if (forward[f].data().get() == data) in.slot = static_cast<int32_t>(f);
    }
  }
  return remapped;
}

}  // namespace sdpa::flex
