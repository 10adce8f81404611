//===- WeightNames.cpp - Canonical weight names, spelled once -------------===//
//
// Every segment of a canonical name appears once in this file; the names are
// byte-identical to those of DESIGN.md (a contract with safetensors files).
//
//===----------------------------------------------------------------------===//
#include "runtime/weights/WeightNames.h"

namespace lmcc::names {

namespace {

constexpr std::string_view kEmbed = "embed";
constexpr std::string_view kHead = "head";
constexpr std::string_view kDecoder = "decoder";

/// "{prefix}.{segment}".
std::string join(std::string_view prefix, std::string_view segment) {
  std::string name;
  name.reserve(prefix.size() + 1 + segment.size());
  name.append(prefix).append(1, '.').append(segment);
  return name;
}

} // namespace

std::string weight(std::string_view prefix) { return join(prefix, "weight"); }
std::string bias(std::string_view prefix) { return join(prefix, "bias"); }

std::string embedToken() { return join(kEmbed, "token"); }
std::string embedPosition() { return join(kEmbed, "position"); }
std::string embedNorm() { return join(kEmbed, "norm"); }

std::string layer(int64_t i) { return layer(std::to_string(i)); }
std::string layer(std::string_view index) { return join("layers", index); }
std::string attn(std::string_view layer) { return join(layer, "attn"); }
std::string attnNorm(std::string_view layer) { return join(layer, "attn_norm"); }
std::string ffn(std::string_view layer) { return join(layer, "ffn"); }
std::string ffnNorm(std::string_view layer) { return join(layer, "ffn_norm"); }

std::string q(std::string_view attention) { return join(attention, "q"); }
std::string k(std::string_view attention) { return join(attention, "k"); }
std::string v(std::string_view attention) { return join(attention, "v"); }
std::string o(std::string_view attention) { return join(attention, "o"); }
std::string relK(std::string_view attention) { return join(attention, "rel_k"); }
std::string relV(std::string_view attention) { return join(attention, "rel_v"); }

std::string ffnIn(std::string_view ffn) { return join(ffn, "in"); }
std::string ffnOut(std::string_view ffn) { return join(ffn, "out"); }

std::string finalNorm() { return "final_norm"; }
std::string headTransform() { return join(kHead, "transform"); }
std::string headNorm() { return join(kHead, "norm"); }
std::string headOutputWeight() { return weight(join(kHead, "output")); }
std::string headBias() { return bias(kHead); }

std::string ngramHead(int64_t j) { return join("ngram.heads", std::to_string(j)); }
std::string encoderLayer(int64_t i) { return join("encoder", layer(i)); }
std::string decoderLayer(int64_t i) { return join(kDecoder, layer(i)); }
std::string decoderDirection() { return join(kDecoder, "direction"); }
std::string cross(std::string_view layer) { return join(layer, "cross"); }
std::string crossNorm(std::string_view layer) { return join(layer, "cross_norm"); }
std::string decoderPositionL2R() { return join(kDecoder, "position.l2r"); }
std::string decoderPositionR2L() { return join(kDecoder, "position.r2l"); }
std::string decoderEmbedNorm() { return join(kDecoder, "embed_norm"); }
std::string encoderFinalNorm() { return join("encoder", finalNorm()); }
std::string decoderFinalNorm() { return join(kDecoder, finalNorm()); }
std::string lengthWeight() { return "length.weight"; }

} // namespace lmcc::names
