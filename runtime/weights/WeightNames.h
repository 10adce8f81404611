//===- WeightNames.h - Canonical weight names, spelled once ---------------===//
//
// The canonical tensor names (DESIGN.md, "Interfaces that stay stable") are a
// contract: safetensors files, generated libraries and the README list use them.
// They are built only here; MLIRGen (lm.weight names), the canonical tensor list
// and Hugging Face import (ModelWeights.cpp) and the reference executor call these
// functions instead of spelling names. Spec-free and MLIR-free.
//
// A name is a dotted path. Module prefixes (a linear layer, a LayerNorm, an
// attention or FFN block, a transformer layer) are built by the functions below;
// the tensors of a linear layer or LayerNorm at prefix P are weight(P) and bias(P).
// For example, layer 2's query weight is
//   weight(q(attn(layer(2))))                         == "layers.2.attn.q.weight"
// and the unilm/bilm/tta tensors are:
//   embedToken()                                      embed.token
//   embedPosition()                                   embed.position
//   weight(embedNorm()), bias(embedNorm())            embed.norm.{weight,bias}
//   weight(q(attn(layer(i)))), bias(...)              layers.{i}.attn.{q,k,v,o}.{weight,bias}
//   relK(attn(layer(i))), relV(attn(layer(i)))        layers.{i}.attn.{rel_k,rel_v}
//   weight(attnNorm(layer(i))), bias(...)             layers.{i}.attn_norm.{weight,bias}
//   weight(ffnIn(ffn(layer(i)))), bias(...)           layers.{i}.ffn.{in,out}.{weight,bias}
//   weight(ffnNorm(layer(i))), bias(...)              layers.{i}.ffn_norm.{weight,bias}
//   weight(finalNorm()), bias(finalNorm())            final_norm.{weight,bias}
//   weight(headTransform()), bias(headTransform())    head.transform.{weight,bias}
//   weight(headNorm()), bias(headNorm())              head.norm.{weight,bias}
//   headOutputWeight()                                head.output.weight
//   headBias()                                        head.bias
// Diformer's stacks mirror them under encoder. and decoder. (encoderLayer(i), encoderFinalNorm(), ...).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lmcc::names {

// --- Tensors of a linear layer or LayerNorm at `prefix` ---------------------------
std::string weight(std::string_view prefix); ///< {prefix}.weight ([out, in] for a linear layer)
std::string bias(std::string_view prefix);   ///< {prefix}.bias

// --- Embeddings -------------------------------------------------------------------
std::string embedToken();    ///< embed.token [V, D] (also the tied output head)
std::string embedPosition(); ///< embed.position [L, D] (learned positions)
std::string embedNorm();     ///< embed.norm: LayerNorm prefix

// --- Transformer layers -------------------------------------------------------------
std::string layer(int64_t i);              ///< layers.{i}
std::string layer(std::string_view index); ///< layers.{index}, index already in decimal
std::string attn(std::string_view layer);     ///< {layer}.attn: attention prefix
std::string attnNorm(std::string_view layer); ///< {layer}.attn_norm: LayerNorm prefix
std::string ffn(std::string_view layer);      ///< {layer}.ffn: FFN prefix
std::string ffnNorm(std::string_view layer);  ///< {layer}.ffn_norm: LayerNorm prefix

// --- Inside an attention prefix (attn() or cross()) -----------------------------------
std::string q(std::string_view attention);    ///< {attention}.q: linear prefix
std::string k(std::string_view attention);    ///< {attention}.k: linear prefix
std::string v(std::string_view attention);    ///< {attention}.v: linear prefix
std::string o(std::string_view attention);    ///< {attention}.o: linear prefix
std::string relK(std::string_view attention); ///< {attention}.rel_k [2k+1, dh]
std::string relV(std::string_view attention); ///< {attention}.rel_v [2k+1, dh]

// --- Inside an FFN prefix (ffn() or ngramHead()) ----------------------------------------
std::string ffnIn(std::string_view ffn);  ///< {ffn}.in: linear prefix [dFF, D]
std::string ffnOut(std::string_view ffn); ///< {ffn}.out: linear prefix [D, dFF]

// --- After the stack ----------------------------------------------------------------
std::string finalNorm();        ///< final_norm: LayerNorm prefix (pre-norm blocks)
std::string headTransform();    ///< head.transform: linear prefix [D, D]
std::string headNorm();         ///< head.norm: LayerNorm prefix
std::string headOutputWeight(); ///< head.output.weight [V, D] (untied heads)
std::string headBias();         ///< head.bias [V]

// --- N-gram heads and Diformer (outside DESIGN.md's list until those families execute)
std::string ngramHead(int64_t j);              ///< ngram.heads.{j}: FFN prefix
std::string encoderLayer(int64_t i);           ///< encoder.layers.{i}
std::string decoderLayer(int64_t i);           ///< decoder.layers.{i}
std::string decoderDirection();                ///< decoder.direction [3, D]
std::string cross(std::string_view layer);     ///< {layer}.cross: attention prefix
std::string crossNorm(std::string_view layer); ///< {layer}.cross_norm: LayerNorm prefix
std::string encoderFinalNorm();                ///< encoder.final_norm: LayerNorm prefix (pre-norm blocks)
std::string decoderFinalNorm();                ///< decoder.final_norm: LayerNorm prefix (pre-norm blocks)
std::string decoderPositionL2R();              ///< decoder.position.l2r [max_len, D] (R and S rows)
std::string decoderPositionR2L();              ///< decoder.position.r2l [max_len, D] (L rows, from the right)
std::string decoderEmbedNorm();                ///< decoder.embed_norm: LayerNorm prefix ([embedding] norm)
std::string lengthWeight();                    ///< length.weight [max_len, D] (length head, no bias)

} // namespace lmcc::names
