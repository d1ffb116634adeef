/* The C ABI from C11: plan lifecycle on the host backend, outputs, errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "baracuda/baracuda.h"

static int failures = 0, checks = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    ++checks;                                                        \
    if (!(cond)) {                                                   \
      ++failures;                                                    \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n",  \
              __FILE__, __LINE__, #cond, baracuda_last_error());     \
    }                                                                \
  } while (0)

int main(void) {
  baracuda_stream host = {NULL, 1};
  float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30}, out[6];
  int64_t shape_a[2] = {2, 3}, shape_b[1] = {3};
  baracuda_tensor in[2] = {{a, BARACUDA_F32, 2, shape_a, NULL}, {b, BARACUDA_F32, 1, shape_b, NULL}};
  baracuda_tensor o = {out, BARACUDA_F32, 2, shape_a, NULL};
  baracuda_attr alpha = {"alpha", 0.5};

  CHECK(baracuda_op_count() > 100);
  CHECK(strcmp(baracuda_dtype_name(BARACUDA_BF16), "bf16") == 0);

  baracuda_plan plan = NULL;
  CHECK(baracuda_plan_create(&plan, host, "add", in, 2, NULL, 0, &alpha, 1) == BARACUDA_OK);
  if (plan) {
    baracuda_dtype dtype;
    int32_t rank = 0;
    int64_t shape[8];
    CHECK(baracuda_plan_output(plan, 0, &dtype, &rank, shape) == BARACUDA_OK);
    CHECK(dtype == BARACUDA_F32 && rank == 2 && shape[0] == 2 && shape[1] == 3);
    size_t ws = 1;
    CHECK(baracuda_plan_workspace_size(plan, &ws) == BARACUDA_OK && ws == 0);
    char sku[256];
    CHECK(baracuda_plan_sku(plan, sku, sizeof sku) == BARACUDA_OK);
    CHECK(strstr(sku, "elementwise/add/f32/host") != NULL);
    char tiny[4];
    CHECK(baracuda_plan_sku(plan, tiny, sizeof tiny) == BARACUDA_ERROR_BUFFER_TOO_SMALL);
    CHECK(baracuda_plan_run(plan, host, NULL, 0, in, 2, &o, 1) == BARACUDA_OK);
    for (int i = 0; i < 6; ++i) CHECK(fabsf(out[i] - (a[i] + 0.5f * b[i % 3])) < 1e-6f);
    /* A run with a mismatched output shape is refused with a message. */
    int64_t wrong[2] = {3, 2};
    baracuda_tensor bad = {out, BARACUDA_F32, 2, wrong, NULL};
    CHECK(baracuda_plan_run(plan, host, NULL, 0, in, 2, &bad, 1) == BARACUDA_ERROR_INVALID_PROBLEM);
    CHECK(strstr(baracuda_last_error(), "shape [3, 2]") != NULL);
    baracuda_plan_destroy(plan);
  }

  /* Strided input (a transposed view) through the ABI. */
  int64_t tshape[2] = {3, 2}, tstrides[2] = {1, 3};
  float t_out[6];
  baracuda_tensor tin = {a, BARACUDA_F32, 2, tshape, tstrides};
  baracuda_tensor tout = {t_out, BARACUDA_F32, 2, tshape, NULL};
  CHECK(baracuda_plan_create(&plan, host, "neg", &tin, 1, &tout, 1, NULL, 0) == BARACUDA_OK);
  if (plan) {
    CHECK(baracuda_plan_run(plan, host, NULL, 0, &tin, 1, &tout, 1) == BARACUDA_OK);
    CHECK(t_out[0] == -1 && t_out[1] == -4 && t_out[2] == -2 && t_out[5] == -6);
    baracuda_plan_destroy(plan);
  }

  /* A reduction (sum over axis 0 of the [2, 3] matrix a) and a row op (softmax
     along the last axis), with the output inferred; then layer_norm's three outputs. */
  {
    baracuda_attr dims = {"dims", 1};
    int64_t shape_s[1] = {3};
    float s_out[3] = {0, 0, 0};
    baracuda_tensor x = {a, BARACUDA_F32, 2, shape_a, NULL};
    baracuda_tensor so = {s_out, BARACUDA_F32, 1, shape_s, NULL};
    CHECK(baracuda_plan_create(&plan, host, "sum", &x, 1, NULL, 0, &dims, 1) == BARACUDA_OK);
    if (plan) {
      size_t ws = 1;
      CHECK(baracuda_plan_workspace_size(plan, &ws) == BARACUDA_OK && ws == 0);
      CHECK(baracuda_plan_run(plan, host, NULL, 0, &x, 1, &so, 1) == BARACUDA_OK);
      for (int j = 0; j < 3; ++j) CHECK(fabsf(s_out[j] - (a[j] + a[3 + j])) < 1e-6f);
      baracuda_plan_destroy(plan);
    }
    baracuda_attr last = {"dim", -1};
    float sm[6];
    baracuda_tensor smo = {sm, BARACUDA_F32, 2, shape_a, NULL};
    CHECK(baracuda_plan_create(&plan, host, "softmax", &x, 1, NULL, 0, &last, 1) == BARACUDA_OK);
    if (plan) {
      CHECK(baracuda_plan_run(plan, host, NULL, 0, &x, 1, &smo, 1) == BARACUDA_OK);
      CHECK(fabsf(sm[0] + sm[1] + sm[2] - 1.0f) < 1e-6f && fabsf(sm[3] + sm[4] + sm[5] - 1.0f) < 1e-6f);
      baracuda_plan_destroy(plan);
    }
    float w[3] = {1, 1, 1}, bias[3] = {0, 0, 0}, y[6], mean[2], rstd[2];
    int64_t shape_w[1] = {3}, shape_r[1] = {2};
    baracuda_tensor ln_in[3] = {x, {w, BARACUDA_F32, 1, shape_w, NULL}, {bias, BARACUDA_F32, 1, shape_w, NULL}};
    baracuda_tensor ln_out[3] = {{y, BARACUDA_F32, 2, shape_a, NULL}, {mean, BARACUDA_F32, 1, shape_r, NULL},
                                 {rstd, BARACUDA_F32, 1, shape_r, NULL}};
    CHECK(baracuda_plan_create(&plan, host, "layer_norm", ln_in, 3, NULL, 0, NULL, 0) == BARACUDA_OK);
    if (plan) {
      CHECK(baracuda_plan_run(plan, host, NULL, 0, ln_in, 3, ln_out, 3) == BARACUDA_OK);
      CHECK(fabsf(mean[0] - (a[0] + a[1] + a[2]) / 3) < 1e-6f && fabsf(y[0] + y[1] + y[2]) < 1e-5f);
      baracuda_plan_destroy(plan);
    }
    /* cross_entropy with class-index targets (mean over the rows), and an
       out-of-range target named in the error. */
    int64_t targets[2] = {2, 0}, shape_t[1] = {2}, shape_none[1] = {0};
    float ce = 0, lse[2];
    baracuda_tensor ce_in[3] = {x, {targets, BARACUDA_I64, 1, shape_t, NULL}, {w, BARACUDA_F32, 1, shape_none, NULL}};
    baracuda_tensor ce_out[2] = {{&ce, BARACUDA_F32, 0, NULL, NULL}, {lse, BARACUDA_F32, 1, shape_r, NULL}};
    CHECK(baracuda_plan_create(&plan, host, "cross_entropy", ce_in, 3, NULL, 0, NULL, 0) == BARACUDA_OK);
    if (plan) {
      CHECK(baracuda_plan_run(plan, host, NULL, 0, ce_in, 3, ce_out, 2) == BARACUDA_OK);
      const float want = ((lse[0] - a[2]) + (lse[1] - a[3])) / 2;
      CHECK(fabsf(ce - want) < 1e-5f && fabsf(lse[0] - logf(expf(a[0]) + expf(a[1]) + expf(a[2]))) < 1e-5f);
      targets[1] = 7;
      CHECK(baracuda_plan_run(plan, host, NULL, 0, ce_in, 3, ce_out, 2) == BARACUDA_ERROR_INVALID_PROBLEM);
      CHECK(strstr(baracuda_last_error(), "class index 7") != NULL);
      baracuda_plan_destroy(plan);
    }
    /* linear with a fused relu: out = relu(a @ w^T + bias) for a [2, 3],
       w [2, 3]; mismatched contraction dims are named in the error. */
    float lw[6] = {1, 0, -1, 0, 1, 2}, lb[2] = {0.5f, -10}, lout[4];
    int64_t shape_lw[2] = {2, 3}, shape_lb[1] = {2}, shape_lo[2] = {2, 2};
    baracuda_tensor lin_in[3] = {{a, BARACUDA_F32, 2, shape_a, NULL}, {lw, BARACUDA_F32, 2, shape_lw, NULL},
                                 {lb, BARACUDA_F32, 1, shape_lb, NULL}};
    baracuda_tensor lin_out[1] = {{lout, BARACUDA_F32, 2, shape_lo, NULL}};
    baracuda_attr relu = {"activation", 1};
    CHECK(baracuda_plan_create(&plan, host, "linear", lin_in, 3, NULL, 0, &relu, 1) == BARACUDA_OK);
    if (plan) {
      CHECK(baracuda_plan_run(plan, host, NULL, 0, lin_in, 3, lin_out, 1) == BARACUDA_OK);
      for (int r = 0; r < 2; ++r)
        for (int o = 0; o < 2; ++o) {
          float v = lb[o];
          for (int k = 0; k < 3; ++k) v += a[r * 3 + k] * lw[o * 3 + k];
          CHECK(fabsf(lout[r * 2 + o] - (v > 0 ? v : 0)) < 1e-6f);
        }
      baracuda_plan_destroy(plan);
    }
    /* grouped_gemm, a list op: every a, then every b; out[0] = a [2, 3] @ b0 [3, 1], out[1] = lw [2, 3] @ b1 [3, 2]. */
    float b0[3] = {1, -1, 2}, b1[6] = {1, 0, 0, 1, 1, 1}, g0[2], g1[4];
    int64_t shape_b0[2] = {3, 1}, shape_b1[2] = {3, 2}, shape_g0[2] = {2, 1};
    baracuda_tensor gg_in[4] = {{a, BARACUDA_F32, 2, shape_a, NULL}, {lw, BARACUDA_F32, 2, shape_lw, NULL},
                                {b0, BARACUDA_F32, 2, shape_b0, NULL}, {b1, BARACUDA_F32, 2, shape_b1, NULL}};
    baracuda_tensor gg_out[2] = {{g0, BARACUDA_F32, 2, shape_g0, NULL}, {g1, BARACUDA_F32, 2, shape_lo, NULL}};
    CHECK(baracuda_plan_create(&plan, host, "grouped_gemm", gg_in, 4, NULL, 0, NULL, 0) == BARACUDA_OK);
    if (plan) {
      CHECK(baracuda_plan_run(plan, host, NULL, 0, gg_in, 4, gg_out, 2) == BARACUDA_OK);
      for (int r = 0; r < 2; ++r) {
        CHECK(g0[r] == a[r * 3] - a[r * 3 + 1] + 2 * a[r * 3 + 2]);
        for (int c = 0; c < 2; ++c) CHECK(g1[r * 2 + c] == lw[r * 3 + c] + lw[r * 3 + 2]);
      }
      baracuda_plan_destroy(plan);
    }
    CHECK(baracuda_plan_create(&plan, host, "grouped_gemm", gg_in, 3, NULL, 0, NULL, 0) ==
          BARACUDA_ERROR_INVALID_PROBLEM);
    CHECK(strstr(baracuda_last_error(), "expected 2 inputs a group") != NULL);
    baracuda_tensor bad_mm[2] = {{a, BARACUDA_F32, 2, shape_a, NULL}, {lw, BARACUDA_F32, 2, shape_lw, NULL}};
    CHECK(baracuda_plan_create(&plan, host, "mm", bad_mm, 2, NULL, 0, NULL, 0) == BARACUDA_ERROR_INVALID_PROBLEM);
    CHECK(strstr(baracuda_last_error(), "cannot be multiplied (3 != 2)") != NULL);
    /* Attention over one query and two keys with equal scores: out is the
       mean of the values, lse = log 2; K/V heads not dividing Q heads are named. */
    float aq[2] = {1, 1}, ak[4] = {1, 0, 0, 1}, av[4] = {2, 4, 6, 8}, aout[2], alse[1];
    int64_t shape_aq[3] = {1, 1, 2}, shape_ak[3] = {1, 2, 2}, shape_lse[2] = {1, 1};
    baracuda_tensor att_in[5] = {{aq, BARACUDA_F32, 3, shape_aq, NULL}, {ak, BARACUDA_F32, 3, shape_ak, NULL},
                                 {av, BARACUDA_F32, 3, shape_ak, NULL}, {NULL, BARACUDA_F32, 1, shape_none, NULL},
                                 {NULL, BARACUDA_F32, 1, shape_none, NULL}};
    baracuda_tensor att_out[2] = {{aout, BARACUDA_F32, 3, shape_aq, NULL}, {alse, BARACUDA_F32, 2, shape_lse, NULL}};
    CHECK(baracuda_plan_create(&plan, host, "scaled_dot_product_attention", att_in, 5, NULL, 0, NULL, 0) == BARACUDA_OK);
    if (plan) {
      CHECK(baracuda_plan_run(plan, host, NULL, 0, att_in, 5, att_out, 2) == BARACUDA_OK);
      CHECK(fabsf(aout[0] - 4) < 1e-6f && fabsf(aout[1] - 6) < 1e-6f);
      CHECK(fabsf(alse[0] - (logf(2.0f) + 1 / sqrtf(2.0f))) < 1e-6f);
      baracuda_plan_destroy(plan);
    }
    int64_t shape_q3[3] = {3, 1, 2}, shape_k2[3] = {2, 2, 2};
    baracuda_tensor bad_att[5] = {{aq, BARACUDA_F32, 3, shape_q3, NULL}, {ak, BARACUDA_F32, 3, shape_k2, NULL},
                                  {av, BARACUDA_F32, 3, shape_k2, NULL}, {NULL, BARACUDA_F32, 1, shape_none, NULL},
                                  {NULL, BARACUDA_F32, 1, shape_none, NULL}};
    CHECK(baracuda_plan_create(&plan, host, "scaled_dot_product_attention", bad_att, 5, NULL, 0, NULL, 0) ==
          BARACUDA_ERROR_INVALID_PROBLEM);
    CHECK(strstr(baracuda_last_error(), "key/value heads (2) must divide query heads (3)") != NULL);
    /* A bad axis names the problem. */
    baracuda_attr bad_dims = {"dims", 4};
    CHECK(baracuda_plan_create(&plan, host, "sum", &x, 1, NULL, 0, &bad_dims, 1) == BARACUDA_ERROR_INVALID_PROBLEM);
    CHECK(strstr(baracuda_last_error(), "names axis 2 but the input has rank 2") != NULL);
  }

  /* Preferences: the defaults, a backend by name, reproducible plans, bad values named. */
  {
    baracuda_preference pref = baracuda_preference_default();
    CHECK(pref.backend == NULL && pref.deterministic_only == 0 && pref.allow_tf32 == 0 &&
          pref.max_workspace_bytes == SIZE_MAX && pref.skip_candidates == 0);
    pref.backend = "host";
    pref.deterministic_only = 1;
    baracuda_attr dims = {"dims", 1};
    baracuda_tensor x = {a, BARACUDA_F32, 2, shape_a, NULL};
    CHECK(baracuda_plan_create_with(&plan, host, "sum", &x, 1, NULL, 0, &dims, 1, &pref) == BARACUDA_OK);
    if (plan) {
      int32_t deterministic = -1;
      char sku[256];
      CHECK(baracuda_plan_deterministic(plan, &deterministic) == BARACUDA_OK && deterministic == 1);
      CHECK(baracuda_plan_sku(plan, sku, sizeof sku) == BARACUDA_OK && strstr(sku, "reduce/sum/f32/host") != NULL);
      baracuda_plan_destroy(plan);
    }
    CHECK(baracuda_plan_deterministic(NULL, NULL) == BARACUDA_ERROR_INVALID_PROBLEM);
    pref.backend = "warp";
    CHECK(baracuda_plan_create_with(&plan, host, "sum", &x, 1, NULL, 0, &dims, 1, &pref) ==
          BARACUDA_ERROR_INVALID_PROBLEM);
    CHECK(strstr(baracuda_last_error(), "unknown backend 'warp'") != NULL && plan == NULL);
    pref.backend = NULL;
    pref.skip_candidates = -1;
    CHECK(baracuda_plan_create_with(&plan, host, "sum", &x, 1, NULL, 0, &dims, 1, &pref) ==
          BARACUDA_ERROR_INVALID_PROBLEM);
    CHECK(strstr(baracuda_last_error(), "skip_candidates must be >= 0, got -1") != NULL);
    /* On a GPU: the bespoke attention backward's plan says whether its runs repeat bit for bit (on Hopper
       at head dim 128 the default sums dQ by reductions in any order); asked for, they must. No data is
       read to make a plan. */
    if (baracuda_cuda_available()) {
      baracuda_stream gpu = {NULL, 0};
      int64_t s_q[4] = {1, 8, 300, 128}, s_lse[3] = {1, 8, 300}, s_none[1] = {0};
      baracuda_tensor bwd[8] = {{NULL, BARACUDA_BF16, 4, s_q, NULL}, {NULL, BARACUDA_BF16, 4, s_q, NULL},
                                {NULL, BARACUDA_BF16, 4, s_q, NULL}, {NULL, BARACUDA_BF16, 4, s_q, NULL},
                                {NULL, BARACUDA_BF16, 4, s_q, NULL}, {NULL, BARACUDA_F32, 3, s_lse, NULL},
                                {NULL, BARACUDA_BF16, 1, s_none, NULL}, {NULL, BARACUDA_F32, 1, s_none, NULL}};
      for (int reproducible = 0; reproducible < 2; ++reproducible) {
        baracuda_preference p = baracuda_preference_default();
        p.backend = "cuda";
        p.deterministic_only = reproducible;
        CHECK(baracuda_plan_create_with(&plan, gpu, "scaled_dot_product_attention_backward", bwd, 8, NULL, 0, NULL,
                                        0, &p) == BARACUDA_OK);
        if (plan) {
          int32_t deterministic = -1;
          char sku[256];
          CHECK(baracuda_plan_deterministic(plan, &deterministic) == BARACUDA_OK);
          CHECK(baracuda_plan_sku(plan, sku, sizeof sku) == BARACUDA_OK);
          CHECK((strstr(sku, ",deterministic") != NULL) == (deterministic == 1));
          if (reproducible) CHECK(deterministic == 1 && strstr(sku, "one_pass") == NULL);
          baracuda_plan_destroy(plan);
        }
      }
    } else {
      printf("capi: the GPU preference checks are skipped (no CUDA device)\n");
    }
  }

  /* Errors: unknown op, broadcast mismatch, rank too large. */
  CHECK(baracuda_plan_create(&plan, host, "no_such_op", in, 2, NULL, 0, NULL, 0) == BARACUDA_ERROR_INVALID_PROBLEM);
  CHECK(strstr(baracuda_last_error(), "no_such_op") != NULL);
  int64_t shape_c[1] = {4};
  baracuda_tensor mismatch[2] = {{a, BARACUDA_F32, 2, shape_a, NULL}, {b, BARACUDA_F32, 1, shape_c, NULL}};
  CHECK(baracuda_plan_create(&plan, host, "mul", mismatch, 2, NULL, 0, NULL, 0) == BARACUDA_ERROR_INVALID_PROBLEM);
  CHECK(strstr(baracuda_last_error(), "do not broadcast") != NULL);
  int64_t big[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  baracuda_tensor rank9 = {a, BARACUDA_F32, 9, big, NULL};
  CHECK(baracuda_plan_create(&plan, host, "exp", &rank9, 1, NULL, 0, NULL, 0) == BARACUDA_ERROR_INVALID_PROBLEM);
  CHECK(strstr(baracuda_last_error(), "rank 9") != NULL);

  printf("capi: %d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}
