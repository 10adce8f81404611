// RUN: lmcc emit-mlir %models/ngram_clm.toml | lmcc-opt | FileCheck %s
// RUN: lmcc emit-mlir --train %models/ngram_clm.toml | lmcc-opt | FileCheck %s --check-prefix=TRAIN
// N-gram CLM (issue 18): pre-norm causal stack; heads 2..n are MLPs of width d_hidden plus the WDR
// conjugate of the logit layer's rows; the ensemble mixes the heads before the one shared logit layer.

// CHECK-LABEL: func.func @score
// CHECK: lm.mask_fill {{.*}}#lm.mask<causal>
// CHECK: lm.weight "final_norm.bias"
// CHECK-NEXT: [[H:%.+]] = lm.layer_norm
// CHECK: lm.weight "ngram.heads.2.in.weight" : tensor<512x512xf32>
// CHECK: [[C2:%.+]] = lm.wdr_conjugate {{.*}} {head = 2 : i64}
// CHECK: [[U2:%.+]] = lm.add {{.*}}[[C2]]
// CHECK: lm.weight "ngram.heads.3.out.weight" : tensor<512x512xf32>
// CHECK: [[C3:%.+]] = lm.wdr_conjugate {{.*}} {head = 3 : i64}
// CHECK: [[U3:%.+]] = lm.add {{.*}}[[C3]]
// CHECK: [[MIX:%.+]] = lm.ngram_ensemble [[H]], [[U2]], [[U3]], %arg1 {lambda = 4.000000e-01 : f64}
// CHECK: [[LOGITS:%.+]] = lm.linear [[MIX]]
// CHECK: [[LP:%.+]] = lm.log_softmax [[LOGITS]]
// CHECK: lm.gather [[LP]], %arg0, %arg1 :
// CHECK: lm.sentence_score {{.*}}first = 1 : i64
// CHECK-NOT: lm.interpolate

// TRAIN-LABEL: func.func @loss
// TRAIN: lm.dropout
// TRAIN: lm.wdr_conjugate {{.*}} {head = 3 : i64}
// TRAIN: lm.ngram_loss {{.*}} {smoothing = 1.000000e-01 : f64}
