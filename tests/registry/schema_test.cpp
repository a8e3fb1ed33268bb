// The schema parser and the declared ops' schemas.

#include <gtest/gtest.h>

#include "sdpa/registry.h"

namespace sdpa {
namespace {

TEST(Schema, ParsesOutVariant) {
  const FunctionSchema s = parse_schema(
      "attention.out(Tensor query, Tensor key, float? scale=None, *, Tensor(a!) out, "
      "Tensor(b!) lse) -> (Tensor(a!) out, Tensor(b!) lse)");
  EXPECT_EQ(s.name, "attention");
  EXPECT_EQ(s.overload, "out");
  EXPECT_EQ(s.full_name(), "attention.out");
  EXPECT_TRUE(s.is_out());
  EXPECT_FALSE(s.is_functional());
  EXPECT_EQ(s.functional_name(), "attention");
  ASSERT_EQ(s.arguments.size(), 5u);
  EXPECT_EQ(s.arguments[2].type, "float");
  EXPECT_TRUE(s.arguments[2].optional);
  EXPECT_EQ(s.arguments[2].default_value, "None");
  EXPECT_FALSE(s.arguments[2].kwarg_only);
  EXPECT_TRUE(s.arguments[3].kwarg_only);
  EXPECT_TRUE(s.arguments[3].is_write);
  EXPECT_EQ(s.arguments[3].alias_set, "a");
  EXPECT_EQ(s.arguments[4].alias_set, "b");
  ASSERT_EQ(s.returns.size(), 2u);
  EXPECT_TRUE(s.returns[1].is_write);
  EXPECT_EQ(s.returns[1].name, "lse");
}

TEST(Schema, ParsesInplaceAndLists) {
  const FunctionSchema s =
      parse_schema("attention_(Tensor(a!) query, Tensor key, bool flag=False) -> Tensor(a!)");
  EXPECT_TRUE(s.is_inplace());
  EXPECT_EQ(s.functional_name(), "attention");
  EXPECT_TRUE(s.arguments[0].is_write);
  ASSERT_EQ(s.returns.size(), 1u);
  EXPECT_EQ(s.returns[0].alias_set, "a");

  const FunctionSchema l = parse_schema("f(Tensor x, int[] dims=[1, 2]) -> (Tensor y, Tensor[] ys)");
  EXPECT_EQ(l.arguments[1].type, "int[]");
  EXPECT_EQ(l.arguments[1].default_value, "[1, 2]");
  EXPECT_EQ(l.returns[1].type, "Tensor[]");
  EXPECT_FALSE(l.returns[1].is_tensor());
}

TEST(Schema, RoundTripsEveryDeclaredOp) {
  const std::vector<OpInfo> all = ops();
  std::vector<std::string> names;
  for (const OpInfo& info : all) {
    names.push_back(info.name);
    EXPECT_EQ(parse_schema(info.schema).to_string(), info.schema) << info.name;
    EXPECT_EQ(parse_schema(info.schema).full_name(), info.name);
  }
  const std::vector<std::string> expected = {
      "attention", "attention.out", "attention_", "attention_backward",
      "attention_backward.out", "merge_attention_states", "materialize_bias"};
  EXPECT_EQ(names, expected);
}

TEST(Schema, SyntaxErrorsNameThePosition) {
  try {
    parse_schema("attention(Tensor query Tensor key) -> Tensor");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected ','"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_schema("f(Tensor) -> Tensor"), Error);          // argument without a name
  EXPECT_THROW(parse_schema("f(Tensor x) Tensor"), Error);           // no arrow
  EXPECT_THROW(parse_schema("f(Tensor x, *, *, Tensor y) -> Tensor"), Error);
}

}  // namespace
}  // namespace sdpa
