// RUN: lmcc-opt %s -split-input-file -verify-diagnostics
// Every verifier rejects malformed ops with a message a user can act on.

func.func @weight_dynamic() {
  // expected-error @+1 {{weights have static shapes}}
  %w = lm.weight "embed.token" : tensor<?x8xf32>
  return
}

// -----

func.func @weight_unnamed() {
  // expected-error @+1 {{needs a non-empty canonical weight name}}
  %w = lm.weight "" : tensor<4x8xf32>
  return
}

// -----

func.func @embed_width(%E: tensor<11x8xf32>, %ids: tensor<?x?xi32>) {
  // expected-error @+1 {{result dim 2 (embedding width): expected 8, got 9}}
  %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x9xf32>
  return
}

// -----

func.func @sinusoidal_odd(%ids: tensor<?x?xi32>) {
  // expected-error @+1 {{sinusoidal positions need an even embedding width}}
  %s = lm.positions %ids : (tensor<?x?xi32>) -> tensor<?x?x7xf32>
  return
}

// -----

func.func @linear_in(%x: tensor<?x?x8xf32>, %w: tensor<4x6xf32>) {
  // expected-error @+1 {{input features vs weight dim 1 (in): expected 6, got 8}}
  %y = lm.linear %x, %w : (tensor<?x?x8xf32>, tensor<4x6xf32>) -> tensor<?x?x4xf32>
  return
}

// -----

func.func @linear_bias(%x: tensor<?x?x8xf32>, %w: tensor<4x8xf32>, %b: tensor<5xf32>) {
  // expected-error @+1 {{bias size vs weight dim 0 (out): expected 4, got 5}}
  %y = lm.linear %x, %w, %b : (tensor<?x?x8xf32>, tensor<4x8xf32>, tensor<5xf32>) -> tensor<?x?x4xf32>
  return
}

// -----

func.func @linear_activation(%x: tensor<?x?x8xf32>, %w: tensor<4x8xf32>) {
  // expected-error @+1 {{activation must be "gelu", "gelu_tanh" or "relu", got "tanh"}}
  %y = lm.linear %x, %w {activation = "tanh"} : (tensor<?x?x8xf32>, tensor<4x8xf32>) -> tensor<?x?x4xf32>
  return
}

// -----

func.func @norm_gamma(%x: tensor<?x?x8xf32>, %g: tensor<7xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{gamma size vs the normalized axis: expected 8, got 7}}
  %y = lm.layer_norm %x, %g, %b {epsilon = 1.0e-12 : f64} : (tensor<?x?x8xf32>, tensor<7xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  return
}

// -----

func.func @norm_eps(%x: tensor<?x?x8xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{epsilon must be positive}}
  %y = lm.layer_norm %x, %g, %g {epsilon = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  return
}

// -----

func.func @split_heads(%x: tensor<?x?x8xf32>) {
  // expected-error @+1 {{heads (3) x head size (3) must equal d_model (8)}}
  %y = lm.split_heads %x : (tensor<?x?x8xf32>) -> tensor<?x3x?x3xf32>
  return
}

// -----

func.func @matmul_k(%a: tensor<?x2x?x4xf32>, %b: tensor<?x2x?x5xf32>) {
  // expected-error @+1 {{contraction size of rhs: expected 4, got 5}}
  %c = lm.matmul %a, %b {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x5xf32>) -> tensor<?x2x?x?xf32>
  return
}

// -----

func.func @directional_without_data(%s: tensor<?x2x?x?xf32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{#lm.mask<directional> needs a data(...) operand}}
  %m = lm.mask_fill %s, %len {mask = #lm.mask<directional>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  return
}

// -----

func.func @directional_old_directions(%s: tensor<?x2x?x?xf32>, %len: tensor<?xi32>, %d: tensor<?x?xi32>) {
  // expected-error @+1 {{directional mask data must be [B, N, 1 + W] i32 rows}}
  %m = lm.mask_fill %s, %len data(%d : tensor<?x?xi32>) {mask = #lm.mask<directional>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  return
}

// -----

func.func @decoder_queries_narrow_table(%rows: tensor<?x?x2xi32>, %len: tensor<?xi32>) {
  %D = lm.weight "decoder.direction" : tensor<2x8xf32>
  %P = lm.weight "decoder.position.l2r" : tensor<9x8xf32>
  // expected-error @+1 {{direction rows: expected 3, got 2}}
  %q = lm.decoder_queries %rows, %len, %D, %P, %P : (tensor<?x?x2xi32>, tensor<?xi32>, tensor<2x8xf32>, tensor<9x8xf32>, tensor<9x8xf32>) -> tensor<?x?x8xf32>
  return
}

// -----

func.func @length_logprob_width(%h: tensor<?x?x8xf32>, %len: tensor<?xi32>) {
  %W = lm.weight "length.weight" : tensor<9x6xf32>
  // expected-error @+1 {{weight width vs hidden width: expected 8, got 6}}
  %l = lm.length_logprob %h, %len, %W, %len : (tensor<?x?x8xf32>, tensor<?xi32>, tensor<9x6xf32>, tensor<?xi32>) -> tensor<?xf32>
  return
}

// -----

func.func @length_logprob_distribution(%h: tensor<?x?x8xf32>, %len: tensor<?xi32>) {
  %W = lm.weight "length.weight" : tensor<9x8xf32>
  // expected-error @+1 {{result width vs weight rows: expected 9, got 7}}
  %l = lm.length_logprob %h, %len, %W : (tensor<?x?x8xf32>, tensor<?xi32>, tensor<9x8xf32>) -> tensor<?x7xf32>
  return
}

// -----

func.func @causal_with_data(%s: tensor<?x2x?x?xf32>, %len: tensor<?xi32>, %d: tensor<?x?xi32>) {
  // expected-error @+1 {{#lm.mask<causal> is fully described by its kind}}
  %m = lm.mask_fill %s, %len data(%d : tensor<?x?xi32>) {mask = #lm.mask<causal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  return
}

// -----

func.func @bad_mask_kind(%s: tensor<?x2x?x?xf32>, %len: tensor<?xi32>) {
  // expected-error @+2 {{to be one of: none, causal, anticausal, diagonal, directional, explicit}}
  // expected-error @+1 {{failed to parse Lm_MaskAttr parameter 'value'}}
  %m = lm.mask_fill %s, %len {mask = #lm.mask<sideways>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  return
}

// -----

func.func @attention_heads(%q: tensor<?x?x8xf32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{heads (3) must divide d_model (8)}}
  %c = lm.attention %q, %q, %q, %len {heads = 3 : i64, mask = #lm.mask<none>, scale = 1.0 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  return
}

// -----

func.func @attention_rel(%q: tensor<?x?x8xf32>, %len: tensor<?xi32>, %r: tensor<5x3xf32>) {
  // expected-error @+1 {{relative tables must be [2 clip + 1, d_model / heads] = [5, 4]}}
  %c = lm.attention %q, %q, %q, %len relative(%r, %r : tensor<5x3xf32>, tensor<5x3xf32>) {clip = 2 : i64, heads = 2 : i64, mask = #lm.mask<none>, scale = 1.0 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  return
}

// -----

func.func @gather_shift(%lp: tensor<?x?x11xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{shift must be >= 0}}
  %g = lm.gather %lp, %ids, %len {shift = -1 : i64} : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return
}

// -----

func.func @interpolate_lambda(%a: tensor<?x?xf32>) {
  // expected-error @+1 {{lambda must be in [0, 1], got 1.5}}
  %m = lm.interpolate %a, %a {lambda = 1.5 : f64} : tensor<?x?xf32>
  return
}

// -----

func.func @token_logprob_width(%h: tensor<?x?x8xf32>, %w: tensor<11x9xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{hidden width vs weight dim 1: expected 9, got 8}}
  %t = lm.token_logprob %h, %w, %ids, %len : (tensor<?x?x8xf32>, tensor<11x9xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return
}

// -----

func.func @mean_pool_cls_exclude(%h: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{cls pooling takes row 0: exclude must be empty}}
  %e = lm.mean_pool %h, %ids, %len {cls, exclude = array<i32: 3>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
  return
}

// -----

func.func @mean_pool_width(%h: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{result width: expected 8, got 7}}
  %e = lm.mean_pool %h, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x7xf32>
  return
}

// -----

func.func @mask_and_predict_arg(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %v: tensor<?x?xf32>) {
  // expected-error @+1 {{the body takes one argument, the masked ids}}
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%m: tensor<?x?xf32>):
    lm.yield %v : tensor<?x?xf32>
  }
  return
}

// -----

func.func @mask_and_predict_type(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %v: tensor<?x?x3xf32>) {
  // expected-error @+1 {{must equal the yielded type}}
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%m: tensor<?x?xi32>):
    lm.yield %v : tensor<?x?x3xf32>
  }
  return
}

// -----

func.func @mask_and_predict_spans(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %spans: tensor<?xi32>, %v: tensor<?x?xf32>) {
  // expected-error @+1 {{spans must have the ids type}}
  %r = lm.mask_and_predict %ids, %len spans(%spans) {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%m: tensor<?x?xi32>):
    lm.yield %v : tensor<?x?xf32>
  }
  return
}

// -----

func.func @masked_batch_ends(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %v: tensor<?x?xf32>) {
  // expected-error @+1 {{the body takes (copies}}
  %r = lm.masked_batch %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%c: tensor<?x?xi32>, %cl: tensor<?xi32>, %t: tensor<?x?xi32>, %p: tensor<?xi32>, %o: tensor<?xi32>):
    lm.yield %v : tensor<?x?xf32>
  }
  return
}

// -----

func.func @cross_entropy_smoothing(%lp: tensor<?x?x11xf32>, %t: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{smoothing must be in [0, 1], got 1.5}}
  %ce = lm.cross_entropy %lp, %t, %len {smoothing = 1.5 : f64} : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return
}

// -----

func.func @linear_grad_weight_shape(%dy: tensor<?x?x8xf32>, %x: tensor<?x?x4xf32>, %w: tensor<8x4xf32>) {
  // expected-error @+1 {{d_weight must be 'tensor<8x4xf32>', got 'tensor<4x8xf32>'}}
  %dx, %dw, %db = lm.linear_grad %dy, %x, %w : (tensor<?x?x8xf32>, tensor<?x?x4xf32>, tensor<8x4xf32>) -> (tensor<?x?x4xf32>, tensor<4x8xf32>, tensor<8xf32>)
  return
}

// -----

func.func @dropout_rate(%x: tensor<?x?x8xf32>) {
  // expected-error @+1 {{rate must be in [0, 1), got 1}}
  %y = lm.dropout %x {rate = 1.0 : f64, site = 0 : i64} : tensor<?x?x8xf32>
  return
}

// -----

func.func @attention_grad_relative(%g: tensor<?x?x8xf32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{has one table gradient per relative table}}
  %dq, %dk, %dv, %r = lm.attention_grad %g, %g, %g, %g, %len {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<3x4xf32>
  return
}

// -----

func.func @param_grad_dynamic(%g: tensor<?x8xf32>) {
  // expected-error @+1 {{a weight gradient has the weight's static shape}}
  lm.param_grad %g {name = "w"} : tensor<?x8xf32>
  return
}

// -----

func.func @wdr_head_one(%E: tensor<11x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{head must be >= 2 (head 1 has no conjugate)}}
  %c = lm.wdr_conjugate %E, %ids, %len {head = 1 : i64} : (tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?x8xf32>
  return
}

// -----

func.func @ensemble_lambda(%h: tensor<?x?x8xf32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{lambda must be in [0, 1]}}
  %m = lm.ngram_ensemble %h, %h, %len {lambda = 1.500000e+00 : f64} : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32>) -> tensor<?x?x8xf32>
  return
}

// -----

func.func @ngram_loss_lse(%h: tensor<?x?x8xf32>, %E: tensor<11x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{one lse result per head}}
  %ce, %l1 = lm.ngram_loss heads(%h, %h : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%E : tensor<11x8xf32>)
      targets(%ids, %len : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 0.0 : f64} -> tensor<?x?xf32>, tensor<?x?xf32>
  return
}

// -----

func.func @dropout_rank(%x: tensor<?x8xf32>) {
  // expected-error @+1 {{input must be a [B, N, C] activation or [B, H, N, M] attention probabilities, got 'tensor<?x8xf32>'}}
  %y = lm.dropout %x {rate = 0.5 : f64, site = 0 : i64} : tensor<?x8xf32>
  return
}

// -----

// No lm op takes a scalar: rank-0 tensors are refused by the operand types (they crashed ConcatOp's verifier).
func.func @concat_scalar(%a: tensor<4xf32>) {
  // expected-error @+1 {{result #0 must be ranked tensor of rank >= 1}}
  %c = lm.concat %a, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
  return
}

// -----

func.func @add_scalar(%a: tensor<f32>) {
  // expected-error @+1 {{must be ranked tensor of rank >= 1}}
  %c = lm.add %a, %a : tensor<f32>
  return
}

// -----

func.func @wdr_head_wide(%E: tensor<11x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{head must be <= 26 (the binomial coefficients C(head-1, i) stay exact in fp32), got 27}}
  %c = lm.wdr_conjugate %E, %ids, %len {head = 27 : i64} : (tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?x8xf32>
  return
}

// -----

func.func @length_logprob_dynamic_width(%h: tensor<?x?x8xf32>, %len: tensor<?xi32>) {
  %W = lm.weight "length.weight" : tensor<9x8xf32>
  // expected-error @+1 {{result width vs weight rows: expected 9, got ?}}
  %l = lm.length_logprob %h, %len, %W : (tensor<?x?x8xf32>, tensor<?xi32>, tensor<9x8xf32>) -> tensor<?x?xf32>
  return
}

// -----

func.func @embed_grad_into_type(%dy: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>, %acc: tensor<10x8xf32>) -> tensor<11x8xf32> {
  // expected-error @+1 {{into (the gradient added to) must have the result's type 'tensor<11x8xf32>', got 'tensor<10x8xf32>'}}
  %g = lm.embed_grad %dy, %ids, %len into(%acc) : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<10x8xf32>) -> tensor<11x8xf32>
  return %g : tensor<11x8xf32>
}

// -----

func.func @token_loss_and_grad_dweight(%h: tensor<?x?x8xf32>, %E: tensor<11x8xf32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{d_weight must be 'tensor<11x8xf32>', got 'tensor<10x8xf32>'}}
  %ce, %lse, %dh, %dE, %db = lm.token_loss_and_grad %h, %E, %y, %len {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?x8xf32>, tensor<10x8xf32>, tensor<11xf32>)
  return
}

// -----

func.func @ngram_loss_and_grad_heads(%h: tensor<?x?x8xf32>, %u: tensor<?x?x8xf32>, %E: tensor<11x8xf32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{needs n >= 2 heads and as many lse and d_heads results}}
  %ce, %l1, %l2, %d1, %dE, %db = lm.ngram_loss_and_grad heads(%h, %u : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%E : tensor<11x8xf32>) targets(%y, %len : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 0.0 : f64} -> tensor<?x?xf32> lse(tensor<?x?xf32>, tensor<?x?xf32>) d_heads(tensor<?x?x8xf32>) tensor<11x8xf32>, tensor<11xf32>
  return
}

// -----

func.func @target_rows_static_count(%y: tensor<?x?xi32>, %len: tensor<?xi32>) {
  // expected-error @+1 {{T (rows dim 1) is known only at run time: it must be ?, got 'tensor<?x4xi32>'}}
  %rows, %t = lm.target_rows %y, %len : (tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x4xi32>, tensor<?x4xi32>)
  return
}

// -----

func.func @target_rows_lengths(%y: tensor<3x?xi32>, %len: tensor<2xi32>) {
  // expected-error @+1 {{lengths dim 0 (B): expected 3, got 2}}
  %rows, %t = lm.target_rows %y, %len : (tensor<3x?xi32>, tensor<2xi32>) -> (tensor<3x?xi32>, tensor<3x?xi32>)
  return
}

// -----

func.func @gather_rows_features(%h: tensor<?x?x8xf32>, %rows: tensor<?x?xi32>) {
  // expected-error @+1 {{dim 2 differs: 'tensor<?x?x8xf32>' -> 'tensor<?x?x4xf32>'}}
  %g = lm.gather_rows %h, %rows : (tensor<?x?x8xf32>, tensor<?x?xi32>) -> tensor<?x?x4xf32>
  return
}

// -----

func.func @gather_rows_rank(%h: tensor<?x?x8xf32>, %rows: tensor<?xi32>) {
  // expected-error @+1 {{rows [B, T] must have rank 2, got 'tensor<?xi32>'}}
  %g = lm.gather_rows %h, %rows : (tensor<?x?x8xf32>, tensor<?xi32>) -> tensor<?x?x8xf32>
  return
}

// -----

func.func @scatter_rows_like(%g: tensor<?x5x8xf32>, %rows: tensor<?x5xi32>, %y: tensor<?x7xi32>) {
  // expected-error @+1 {{result dim 1: expected 7, got 6}}
  %s = lm.scatter_rows %g, %rows, %y : (tensor<?x5x8xf32>, tensor<?x5xi32>, tensor<?x7xi32>) -> tensor<?x6x8xf32>
  return
}

// -----

func.func @dropout_rows_probabilities(%p: tensor<?x2x?x?xf32>, %rows: tensor<?x?xi32>) {
  // expected-error @+1 {{rows (packed rows) apply to a [B, T, C] activation, got 'tensor<?x2x?x?xf32>'}}
  %d = lm.dropout %p rows(%rows : tensor<?x?xi32>) {rate = 0.1 : f64, site = 1048576 : i64} : tensor<?x2x?x?xf32>
  return
}
