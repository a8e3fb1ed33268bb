// Flex score_mods as cuDNN score_mod / score_mod_bprop subgraphs (score_mod_graph.h).

#include "cudnn/score_mod_graph.h"

#include <cmath>
#include <mutex>
#include <sstream>
#include <string>

#include "core/fnv.h"
#include "cudnn/graph_build.h"
#include "cudnn/graph_cache.h"
#include "flex/autodiff.h"
#include "flex/node.h"
#include "sdpa/cuda.h"

namespace sdpa::cudnn {
namespace {

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using Kind = LoweredNode::Kind;

// ---- lowering, cached per call signature ----------------------------------------------

// Everything the lowering reads: the program's structure (constants included, so the
// compiled form's identity), the call's sizes, and each captured tensor's layout.
std::string cache_key(const AttentionParams& p, const flex::Program& program, bool additive) {
  std::ostringstream os;
  os << additive << ' ';
  os << program.compiled().get() << ' ' << p.backward << ' ' << p.batch << ' ' << p.num_heads_q
     << ' ' << p.q_len << ' ' << p.kv_len << ' ' << p.device.index;
  for (const flex::Captured& c : program.captured()) {
    const Tensor& t = c.tensor();
    os << " | " << static_cast<int>(t.dtype()) << ' ' << static_cast<int>(t.device().type) << ' '
       << t.device().index << ' ' << c.requires_grad();
    for (int64_t d = 0; d < t.dim(); ++d) os << ' ' << t.size(d) << ':' << t.stride(d);
  }
  return os.str();
}

struct CacheEntry {
  std::shared_ptr<const flex::CompiledProgram> program;  // keeps the key's address unique
  std::shared_ptr<const ScoreModGraph> graph;            // null when refused
  std::vector<std::string> reasons;
};

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, CacheEntry> map;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: lowered graphs may be in use at exit
  return *c;
}

// Distinct (program, sizes, layout) signatures kept before the cache starts over.
constexpr size_t kCapacity = 256;

// Gives every read node of `lowered` its own graph input, naming the score_mod's captured
// slot of the tensor it reads (`captured` are the lowered program's, `forward` the
// score_mod's: a derived program reads the same tensors in its own order).
std::vector<int> add_inputs(const LoweredScoreMod& lowered,
                            const std::vector<flex::Captured>& captured,
                            const std::vector<flex::Captured>& forward, ScoreModGraph& g) {
  std::vector<int> index(lowered.nodes.size(), -1);
  for (size_t i = 0; i < lowered.nodes.size(); ++i) {
    const LoweredNode& n = lowered.nodes[i];
    if (!n.live || n.kind != Kind::kTensor) continue;
    const flex::CapturedData* data = captured[static_cast<size_t>(n.slot)].data().get();
    int slot = -1;
    for (size_t f = 0; f < forward.size(); ++f) {
      if (forward[f].data().get() == data) slot = static_cast<int>(f);
    }
    SDPA_CHECK(slot >= 0, "cuDNN score_mod: a derived program reads a tensor the score_mod "
               "does not capture");
    index[i] = static_cast<int>(g.inputs.size());
    g.inputs.push_back({slot, n.dtype, n.dims, n.strides});
  }
  return index;
}

// cuDNN hands the subgraph the score and takes back a tensor computed from it.
bool result_reads_score(const LoweredScoreMod& l) {
  for (const LoweredNode& n : l.nodes) {
    if (n.live && n.kind == Kind::kScore) return true;
  }
  return false;
}

std::shared_ptr<const ScoreModGraph> lower_uncached(const AttentionParams& p,
                                                    const flex::Program& program, Reasons& r,
                                                    bool additive) {
  const std::array<int64_t, 4> sizes{p.batch, p.num_heads_q, p.q_len, p.kv_len};
  bool ok = true;
  for (const flex::Captured& c : program.captured()) {
    const Device d = c.tensor().device();
    if (d.type == DeviceType::kCUDA && d.index != p.device.index) {
      r.add("flex: captured tensor '", c.name(), "' is on ", device_name(d),
            ", not on the call's ", device_name(p.device));
      ok = false;
    }
    if (p.backward && c.requires_grad()) {
      r.add("flex: captured tensor '", c.name(), "' requires grad; cuDNN's score_mod_bprop "
            "subgraph returns no gradient for captured tensors");
      ok = false;
    }
  }
  auto g = std::make_shared<ScoreModGraph>();
  if (!lower_score_mod(program, sizes, g->forward, r)) return nullptr;
  if (!result_reads_score(g->forward)) {
    r.add("flex: the score_mod's result does not read score; cuDNN needs the score in it");
    return nullptr;
  }
  g->forward_input = add_inputs(g->forward, program.captured(), program.captured(), *g);
  // Measured on an H200 with cuDNN 9.19: backward graphs whose score_mod reads a captured
  // tensor returned grad_v = 0 (grad_q, grad_k right) unless the score_mod ends in a mask
  // select; with the select (ALiBi or documents beside a mask) every gradient matched.
  const LoweredNode& result = g->forward.nodes[static_cast<size_t>(g->forward.result)];
  if (p.backward && !g->inputs.empty() &&
      !(result.kind == Kind::kOp && result.op == PointwiseOp::kSelect)) {
    r.add("flex: cuDNN's backward of a score_mod that reads captured tensors and does not "
          "end in a mask select gave a wrong grad_v (H200, cuDNN 9.19); not used");
    return nullptr;
  }
  sdpa::detail::Fnv1a fingerprint;
  fingerprint.word(g->forward.fingerprint());
  if (p.backward && ok && additive) {
    g->derivative_is_one = true;
  } else if (p.backward && ok) {
    flex::GradientProgram d;
    try {
      d = flex::differentiate(program);
    } catch (const Error& e) {
      r.add(e.what());
      return nullptr;
    }
    if (!lower_instructions(*d.program, d.d_score, d.captured, sizes, g->derivative, r)) {
      return nullptr;
    }
    g->derivative_input = add_inputs(g->derivative, d.captured, program.captured(), *g);
    const LoweredNode& d_result = g->derivative.nodes[static_cast<size_t>(g->derivative.result)];
    g->derivative_is_one = d_result.kind == Kind::kConstant && d_result.constant == 1.0;
    fingerprint.word(g->derivative.fingerprint());
  }
  g->fingerprint = fingerprint.value;
  return ok ? g : nullptr;
}

// ---- graph building ---------------------------------------------------------------------

fe::DataType_t value_type(flex::ValueType t) {
  switch (t) {
    case flex::ValueType::kFloat: return fe::DataType_t::FLOAT;
    case flex::ValueType::kInt: return fe::DataType_t::INT32;
    case flex::ValueType::kBool: return fe::DataType_t::BOOLEAN;
  }
  return fe::DataType_t::FLOAT;
}

fe::DataType_t element_type(DType d) {
  switch (d) {
    case DType::kFloat16: return fe::DataType_t::HALF;
    case DType::kBFloat16: return fe::DataType_t::BFLOAT16;
    case DType::kInt32: return fe::DataType_t::INT32;
    default: return fe::DataType_t::FLOAT;
  }
}

fe::PointwiseMode_t mode_of(PointwiseOp op) {
  using M = fe::PointwiseMode_t;
  static constexpr M kModes[] = {
      M::ADD,    M::SUB,    M::MUL,    M::DIV,    M::MIN,    M::MAX,     M::NEG,
      M::ABS,    M::EXP,    M::LOG,    M::TANH_FWD, M::SIGMOID_FWD, M::SQRT, M::IDENTITY,
      M::CMP_LT, M::CMP_LE, M::CMP_GT, M::CMP_GE, M::CMP_EQ, M::CMP_NEQ, M::LOGICAL_AND,
      M::LOGICAL_OR, M::LOGICAL_NOT, M::BINARY_SELECT};
  return kModes[static_cast<size_t>(op)];
}

// The mode computing the same result with the operands swapped, or false.
bool swapped(fe::PointwiseMode_t mode, fe::PointwiseMode_t& out) {
  using M = fe::PointwiseMode_t;
  switch (mode) {
    case M::ADD: case M::MUL: case M::MIN: case M::MAX: case M::CMP_EQ: case M::CMP_NEQ:
    case M::LOGICAL_AND: case M::LOGICAL_OR:
      out = mode;
      return true;
    case M::CMP_LT: out = M::CMP_GT; return true;
    case M::CMP_GT: out = M::CMP_LT; return true;
    case M::CMP_LE: out = M::CMP_GE; return true;
    case M::CMP_GE: out = M::CMP_LE; return true;
    default: return false;
  }
}

// State the score_mod and score_mod_bprop builders of one graph share.
struct Shared {
  std::shared_ptr<const ScoreModGraph> g;
  std::vector<TensorPtr> inputs;  // per g->inputs
  TensorPtr forward_score;        // the score the forward subgraph was handed
};

class Emitter {
 public:
  Emitter(fe::graph::Graph& graph, const char* prefix) : graph_(graph), prefix_(prefix) {}

  TensorPtr op(fe::PointwiseMode_t mode, fe::DataType_t compute, fe::DataType_t out_type,
               std::vector<TensorPtr> in) {
    auto attributes = fe::graph::Pointwise_attributes()
                          .set_name(prefix_ + std::to_string(count_++))
                          .set_mode(mode)
                          .set_compute_data_type(compute);
    TensorPtr out = in.size() == 1   ? graph_.pointwise(in[0], attributes)
                    : in.size() == 2 ? graph_.pointwise(in[0], in[1], attributes)
                                     : graph_.pointwise(in[0], in[1], in[2], attributes);
    out->set_data_type(out_type);
    return out;
  }

  // cuDNN's pointwise nodes take a graph input or scalar only as a later operand: the
  // first operand is swapped behind a computed one (node()), or made a computed tensor.
  // A tensor input is copied; a scalar has no shape of its own, so it is broadcast over
  // the scores as (kv index * 0) + value, which is exact.
  TensorPtr computed(TensorPtr t) {
    using M = fe::PointwiseMode_t;
    if (t->get_is_virtual()) return t;
    const fe::DataType_t type = t->get_data_type();
    if (!t->get_is_pass_by_value()) return op(M::IDENTITY, type, type, {t});
    const TensorPtr zero = op(M::MUL, fe::DataType_t::INT32, fe::DataType_t::INT32,
                              {index(3), std::make_shared<fe::graph::Tensor_attributes>(int32_t{0})});
    return op(M::ADD, type, type, {zero, t});
  }

  // GEN_INDEX along `axis` of the scores (0 b, 1 h, 2 q_idx, 3 kv_idx), int32.
  TensorPtr index(int axis) {
    auto attributes = fe::graph::Pointwise_attributes()
                          .set_name(prefix_ + "index" + std::to_string(count_++))
                          .set_mode(fe::PointwiseMode_t::GEN_INDEX)
                          .set_axis(axis)
                          .set_compute_data_type(fe::DataType_t::INT32);
    TensorPtr out = graph_.pointwise(score_, attributes);
    out->set_data_type(fe::DataType_t::INT32);
    return out;
  }

  // cuDNN's logical operations read int32.
  TensorPtr as_int(TensorPtr t) {
    if (t->get_data_type() == fe::DataType_t::INT32) return t;
    return op(fe::PointwiseMode_t::IDENTITY, fe::DataType_t::INT32, fe::DataType_t::INT32, {t});
  }

  TensorPtr node(const LoweredNode& n, const std::vector<TensorPtr>& v) {
    using M = fe::PointwiseMode_t;
    const auto arg = [&](size_t i) { return v[static_cast<size_t>(n.args[i])]; };
    const fe::DataType_t type = value_type(n.type);
    M mode = mode_of(n.op);
    if (n.op == PointwiseOp::kSelect) return op(mode, type, type, {computed(arg(1)), arg(2), arg(0)});
    if (mode == M::LOGICAL_AND || mode == M::LOGICAL_OR || mode == M::LOGICAL_NOT) {
      std::vector<TensorPtr> in;
      for (size_t i = 0; i < n.args.size(); ++i) in.push_back(as_int(computed(arg(i))));
      return op(mode, fe::DataType_t::INT32, type, in);
    }
    if (n.args.size() == 1) return op(mode, type, type, {computed(arg(0))});
    TensorPtr a = arg(0), b = arg(1);
    // x / c as x * (1 / c): a multiply per score instead of a division (within an ulp).
    const LoweredNode& divisor = l_->nodes[static_cast<size_t>(n.args[1])];
    if (mode == M::DIV && type == fe::DataType_t::FLOAT && divisor.kind == Kind::kConstant &&
        std::isnormal(static_cast<float>(1.0 / divisor.constant))) {
      mode = M::MUL;
      b = std::make_shared<fe::graph::Tensor_attributes>(static_cast<float>(1.0 / divisor.constant));
    }
    M flipped;
    if (!a->get_is_virtual() && b->get_is_virtual() && swapped(mode, flipped)) {
      std::swap(a, b);
      mode = flipped;
    }
    // Comparisons compute in their operands' type; arithmetic in its result's.
    const fe::DataType_t compute = n.type == flex::ValueType::kBool ? fe::DataType_t::BOOLEAN : type;
    return op(mode, compute, type, {computed(a), b});
  }

  TensorPtr program(const LoweredScoreMod& l, const std::vector<int>& input_of, Shared& s,
                    const TensorPtr& score) {
    score_ = score;
    l_ = &l;
    std::vector<TensorPtr> v(l.nodes.size());
    for (size_t i = 0; i < l.nodes.size(); ++i) {
      const LoweredNode& n = l.nodes[i];
      if (!n.live) continue;
      switch (n.kind) {
        case Kind::kScore: v[i] = score; break;
        case Kind::kIndex: v[i] = index(n.axis); break;
        case Kind::kConstant:
          v[i] = n.type == flex::ValueType::kInt
                     ? std::make_shared<fe::graph::Tensor_attributes>(static_cast<int32_t>(n.constant))
                     : std::make_shared<fe::graph::Tensor_attributes>(static_cast<float>(n.constant));
          break;
        case Kind::kTensor: v[i] = s.inputs[static_cast<size_t>(input_of[i])]; break;
        case Kind::kOp: v[i] = node(n, v); break;
      }
    }
    return v[static_cast<size_t>(l.result)];
  }

 private:
  fe::graph::Graph& graph_;
  TensorPtr score_;  // the scores the subgraph is built over (GEN_INDEX reads its shape)
  const LoweredScoreMod* l_ = nullptr;  // the program being emitted
  std::string prefix_;
  int count_ = 0;
};

std::shared_ptr<Shared> make_shared_state(fe::graph::Graph& graph,
                                          std::shared_ptr<const ScoreModGraph> g) {
  auto s = std::make_shared<Shared>();
  for (size_t i = 0; i < g->inputs.size(); ++i) {
    const ScoreModInput& in = g->inputs[i];
    s->inputs.push_back(graph.tensor(fe::graph::Tensor_attributes()
                                         .set_name("score_mod_tensor" + std::to_string(i))
                                         .set_uid(kScoreModTensor + static_cast<int64_t>(i))
                                         .set_dim({in.dims.begin(), in.dims.end()})
                                         .set_stride({in.strides.begin(), in.strides.end()})
                                         .set_data_type(element_type(in.dtype))));
  }
  s->g = std::move(g);
  return s;
}

auto forward_builder(std::shared_ptr<Shared> s) {
  return [s](std::shared_ptr<fe::graph::Graph> sub, TensorPtr score) {
    s->forward_score = score;
    return Emitter(*sub, "score_mod_").program(s->g->forward, s->g->forward_input, *s, score);
  };
}

}  // namespace

std::shared_ptr<const ScoreModGraph> lower_score_mod_graph(const AttentionParams& p,
                                                           const flex::Program& program,
                                                           Reasons& r, bool additive) {
  const std::string key = cache_key(p, program, additive);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    const auto it = c.map.find(key);
    if (it != c.map.end()) {
      for (const std::string& reason : it->second.reasons) r.add(reason);
      return it->second.graph;
    }
  }
  Reasons all;  // cached whole, so a later caller that collects sees every reason
  CacheEntry entry{program.compiled(), lower_uncached(p, program, all, additive), all.items};
  for (const std::string& reason : entry.reasons) r.add(reason);
  std::lock_guard lock(c.mu);
  if (c.map.size() >= kCapacity) c.map.clear();
  return c.map.emplace(key, std::move(entry)).first->second.graph;
}

void set_score_mod(fe::graph::Graph& graph, fe::graph::SDPA_attributes& attributes,
                   std::shared_ptr<const ScoreModGraph> g) {
  attributes.set_score_mod(forward_builder(make_shared_state(graph, std::move(g))));
}

void set_score_mod(fe::graph::Graph& graph, fe::graph::SDPA_backward_attributes& attributes,
                   std::shared_ptr<const ScoreModGraph> g) {
  auto s = make_shared_state(graph, std::move(g));
  attributes.set_score_mod(forward_builder(s));
  if (s->g->derivative_is_one) return;
  // dS of the modded score times d(score_mod)/d(score) at the forward's score.
  attributes.set_score_mod_bprop([s](std::shared_ptr<fe::graph::Graph> sub, TensorPtr grad) {
    Emitter emit(*sub, "score_mod_bprop_");
    const TensorPtr derivative =
        emit.program(s->g->derivative, s->g->derivative_input, *s, s->forward_score);
    return emit.op(fe::PointwiseMode_t::MUL, fe::DataType_t::FLOAT, fe::DataType_t::FLOAT,
                   {grad, derivative});
  });
}

void bind_score_mod_tensors(const ScoreModCall& call, const AttentionParams& p,
                            std::unordered_map<int64_t, void*>& pack, std::vector<Tensor>& keep) {
  const ScoreModGraph& g = *call.graph;
  std::unordered_map<int, void*> copied;  // one copy per host tensor
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const int slot = g.inputs[i].slot;
    const Tensor& t = call.program->captured()[static_cast<size_t>(slot)].tensor();
    void* ptr = nullptr;
    if (t.device().type == DeviceType::kCUDA) {
      ptr = t.data_ptr();
    } else if (auto it = copied.find(slot); it != copied.end()) {
      ptr = it->second;
    } else {
      keep.push_back(cuda::to_device(t, p.device, p.stream));
      ptr = keep.back().data_ptr();
      copied.emplace(slot, ptr);
    }
    pack[kScoreModTensor + static_cast<int64_t>(i)] = ptr;
  }
}

}  // namespace sdpa::cudnn
