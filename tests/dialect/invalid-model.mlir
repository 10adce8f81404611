// RUN: lmcc-opt %s -split-input-file -verify-diagnostics
// The module's declared facts (issue 13: the IR describes the model) are checked for sense: the lowering and the
// header read them, so a module that could not be a model is refused where it is parsed.

// expected-error @+1 {{#lm.model: name "bad name-1" is not a C identifier}}
module attributes {lm.model = #lm.model<name = "bad name-1", vocab = 67, max_len = 24, d_model = 30, heads = 3, d_ff = 46, layers = 2, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {}

// -----

// expected-error @+1 {{#lm.model: max_len must be positive, got 0}}
module attributes {lm.model = #lm.model<name = "m", vocab = 67, max_len = 0, d_model = 30, heads = 3, d_ff = 46, layers = 2, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {}

// -----

// expected-error @+1 {{#lm.model: vocab must be positive, got -5}}
module attributes {lm.model = #lm.model<name = "m", vocab = -5, max_len = 24, d_model = 30, heads = 3, d_ff = 46, layers = 2, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {}

// -----

// expected-error @+1 {{#lm.model: heads (7) must divide d_model (30)}}
module attributes {lm.model = #lm.model<name = "m", vocab = 67, max_len = 24, d_model = 30, heads = 7, d_ff = 46, layers = 2, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {}

// -----

// expected-error @+1 {{#lm.model: bos id 99999 is outside the vocabulary [0, 67)}}
module attributes {lm.model = #lm.model<name = "m", vocab = 67, max_len = 24, d_model = 30, heads = 3, d_ff = 46, layers = 2, pad = 0, eos = 1, unk = 2, bos = 99999, mask = 4>} {}

// -----

// expected-error @+1 {{attribute 'lm.family' must be one of "unilm", "bilm", "tta", "ngram", "diformer" on a module}}
module attributes {lm.family = "nonsense"} {}

// -----

module {
  // expected-error @+1 {{attribute 'lm.method' must be an entry point's method (causal, mask-and-predict, single-pass}}
  func.func @score() attributes {lm.method = "bogus"} {
    return
  }
}
