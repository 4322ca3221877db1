// The precision policy grammar (jmp's get_policy).
#include "nn/precision.h"

#include "base/check.h"

#include <gtest/gtest.h>

namespace remat::nn {
namespace {

PrecisionPolicy P(DType p, DType c, DType o) { return PrecisionPolicy{p, c, o}; }

TEST(Precision, AcceptsJmpsDocumentedForms) {
  EXPECT_EQ(parse_precision("params=float32,compute=bfloat16,output=float32"), P(DType::f32, DType::bf16, DType::f32));
  EXPECT_EQ(parse_precision("p=f32,c=bf16,o=f32"), P(DType::f32, DType::bf16, DType::f32));
  EXPECT_EQ(parse_precision("c=f16"), P(DType::f32, DType::f16, DType::f16));      // compute follows; output follows compute
  EXPECT_EQ(parse_precision("p=bf16"), P(DType::bf16, DType::bf16, DType::bf16));  // compute follows params
  EXPECT_EQ(parse_precision("p=f32,c=bf16"), P(DType::f32, DType::bf16, DType::bf16));
  EXPECT_EQ(parse_precision("bfloat16"), P(DType::bf16, DType::bf16, DType::bf16));  // a bare dtype sets all
  EXPECT_EQ(parse_precision("full"), P(DType::f32, DType::f32, DType::f32));
  EXPECT_EQ(parse_precision("half"), P(DType::bf16, DType::bf16, DType::bf16));     // bf16 on these CPUs
  EXPECT_EQ(parse_precision(" p = float32 , c = float16 "), P(DType::f32, DType::f16, DType::f16));
  EXPECT_EQ(parse_precision("p=f32,c=bf16,o=f32").str(), "p=f32,c=bf16,o=f32");
}

TEST(Precision, RejectsBadStringsShowingTheGrammar) {
  auto error = [](const std::string& text) {
    try {
      parse_precision(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("p=f32,c=int8").find("unknown dtype 'int8'"), std::string::npos);
  EXPECT_NE(error("params=f32,kompute=bf16").find("unknown key 'kompute'"), std::string::npos);
  EXPECT_NE(error("p=f32,p=bf16").find("'p' is given twice"), std::string::npos);
  EXPECT_NE(error("p=f32,c").find("is not key=dtype"), std::string::npos);
  EXPECT_NE(error("").find("is empty"), std::string::npos);
  EXPECT_NE(error("quarter").find("use jmp's grammar"), std::string::npos);
}

}  // namespace
}  // namespace remat::nn
