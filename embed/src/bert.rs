//! A BERT encoder's forward pass for one sequence (no batch, no padding, no dropout): embeddings,
//! `layers` blocks of self-attention and feed-forward with post-layer-norm, GELU (erf).

use serde::Deserialize;

use crate::matmul::linear;
use crate::weights::Tensors;
use crate::LoadError;

/// The fields of `config.json` the forward pass reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    #[serde(default = "eps")]
    pub layer_norm_eps: f32,
    #[serde(default = "gelu")]
    pub hidden_act: String,
}

fn two() -> usize {
    2
}
fn eps() -> f32 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}

struct Dense {
    w: Vec<f32>,
    b: Vec<f32>,
    outputs: usize,
}

struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

struct Layer {
    q: Dense,
    k: Dense,
    v: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    up: Dense,
    down: Dense,
    out_norm: Norm,
}

pub struct Bert {
    cfg: Config,
    words: Vec<f32>,
    positions: Vec<f32>,
    types: Vec<f32>,
    embed_norm: Norm,
    layers: Vec<Layer>,
}

impl Bert {
    pub fn load(cfg: Config, t: &Tensors<'_>) -> Result<Bert, LoadError> {
        let h = cfg.hidden_size;
        if cfg.hidden_act != "gelu" {
            return Err(LoadError::Format(format!(
                "config.json: hidden_act {} (only gelu)",
                cfg.hidden_act
            )));
        }
        if h == 0
            || cfg.num_attention_heads == 0
            || !h.is_multiple_of(cfg.num_attention_heads)
            || h > 4096
            || cfg.intermediate_size > 16384
            || cfg.num_hidden_layers > 48
            || cfg.max_position_embeddings > 8192
            || cfg.vocab_size > 1 << 20
        {
            return Err(LoadError::Format(format!(
                "config.json: unsupported shape {cfg:?}"
            )));
        }
        // Tensors are named `embeddings.…` (a sentence-transformers export) or `bert.embeddings.…`.
        let prefix = if t.has("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let get = |name: &str, shape: &[usize]| t.f32(&format!("{prefix}{name}"), shape);
        let dense = |name: &str, outputs: usize, inputs: usize| -> Result<Dense, LoadError> {
            Ok(Dense {
                w: get(&format!("{name}.weight"), &[outputs, inputs])?,
                b: get(&format!("{name}.bias"), &[outputs])?,
                outputs,
            })
        };
        let norm = |name: &str| -> Result<Norm, LoadError> {
            Ok(Norm {
                w: get(&format!("{name}.weight"), &[h])?,
                b: get(&format!("{name}.bias"), &[h])?,
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = format!("encoder.layer.{i}");
            layers.push(Layer {
                q: dense(&format!("{l}.attention.self.query"), h, h)?,
                k: dense(&format!("{l}.attention.self.key"), h, h)?,
                v: dense(&format!("{l}.attention.self.value"), h, h)?,
                attn_out: dense(&format!("{l}.attention.output.dense"), h, h)?,
                attn_norm: norm(&format!("{l}.attention.output.LayerNorm"))?,
                up: dense(&format!("{l}.intermediate.dense"), cfg.intermediate_size, h)?,
                down: dense(&format!("{l}.output.dense"), h, cfg.intermediate_size)?,
                out_norm: norm(&format!("{l}.output.LayerNorm"))?,
            });
        }
        Ok(Bert {
            words: get("embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?,
            positions: get(
                "embeddings.position_embeddings.weight",
                &[cfg.max_position_embeddings, h],
            )?,
            types: get(
                "embeddings.token_type_embeddings.weight",
                &[cfg.type_vocab_size, h],
            )?,
            embed_norm: norm("embeddings.LayerNorm")?,
            layers,
            cfg,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The last hidden states of `ids` (row-major, `ids.len()` × hidden). `ids` must be valid
    /// token ids, at most `max_position_embeddings` of them (the caller cuts).
    pub fn forward(&self, ids: &[u32]) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let n = ids.len();
        assert!(n <= self.cfg.max_position_embeddings);
        let mut x = vec![0f32; n * h];
        for (p, &id) in ids.iter().enumerate() {
            let id = (id as usize).min(self.cfg.vocab_size - 1);
            let row = &mut x[p * h..(p + 1) * h];
            let word = &self.words[id * h..(id + 1) * h];
            let pos = &self.positions[p * h..(p + 1) * h];
            for (i, r) in row.iter_mut().enumerate() {
                *r = word[i] + pos[i] + self.types[i];
            }
        }
        layer_norm(&mut x, &self.embed_norm, h, self.cfg.layer_norm_eps);
        for layer in &self.layers {
            self.block(layer, &mut x, n);
        }
        x
    }

    fn block(&self, l: &Layer, x: &mut [f32], n: usize) {
        let h = self.cfg.hidden_size;
        let heads = self.cfg.num_attention_heads;
        let d = h / heads;
        let eps = self.cfg.layer_norm_eps;
        let q = apply(&l.q, x, n, h);
        let k = apply(&l.k, x, n, h);
        let v = apply(&l.v, x, n, h);
        let scale = 1.0 / (d as f32).sqrt();
        let mut ctx = vec![0f32; n * h];
        let mut scores = vec![0f32; n];
        for head in 0..heads {
            let off = head * d;
            for i in 0..n {
                let qi = &q[i * h + off..i * h + off + d];
                for (j, s) in scores.iter_mut().enumerate() {
                    let kj = &k[j * h + off..j * h + off + d];
                    *s = dot(qi, kj) * scale;
                }
                softmax(&mut scores);
                let out = &mut ctx[i * h + off..i * h + off + d];
                for (j, &s) in scores.iter().enumerate() {
                    let vj = &v[j * h + off..j * h + off + d];
                    for (o, &vv) in out.iter_mut().zip(vj) {
                        *o += s * vv;
                    }
                }
            }
        }
        let attn = apply(&l.attn_out, &ctx, n, h);
        for (xi, a) in x.iter_mut().zip(&attn) {
            *xi += a;
        }
        layer_norm(x, &l.attn_norm, h, eps);
        let mut up = apply(&l.up, x, n, h);
        for u in &mut up {
            *u = gelu_erf(*u);
        }
        let down = apply(&l.down, &up, n, self.cfg.intermediate_size);
        for (xi, dv) in x.iter_mut().zip(&down) {
            *xi += dv;
        }
        layer_norm(x, &l.out_norm, h, eps);
    }
}

fn apply(dense: &Dense, x: &[f32], n: usize, inputs: usize) -> Vec<f32> {
    linear(x, n, inputs, &dense.w, &dense.b, dense.outputs)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn softmax(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in s.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in s.iter_mut() {
        *v /= sum;
    }
}

fn layer_norm(x: &mut [f32], norm: &Norm, h: usize, eps: f32) {
    for row in x.chunks_exact_mut(h) {
        let mean = row.iter().sum::<f32>() / h as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            *v = (*v - mean) * inv * norm.w[i] + norm.b[i];
        }
    }
}

/// GELU with the error function (BERT's `gelu`), erf by Abramowitz and Stegun 7.1.26 (absolute
/// error under 1.5e-7).
fn gelu_erf(x: f32) -> f32 {
    let z = x / std::f32::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let erf = (1.0 - poly * (-z * z).exp()).copysign(z);
    0.5 * x * (1.0 + erf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_known_values() {
        // GELU(x) = x * Phi(x): Phi(1) = 0.841345, Phi(-1) = 0.158655, Phi(2) = 0.977250.
        for (x, want) in [
            (0.0, 0.0),
            (1.0, 0.841_345),
            (-1.0, -0.158_655),
            (2.0, 1.954_5),
        ] {
            assert!((gelu_erf(x) - want).abs() < 1e-4, "{x}: {}", gelu_erf(x));
        }
    }

    #[test]
    fn softmax_and_layer_norm() {
        let mut s = [1.0, 2.0, 3.0];
        softmax(&mut s);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6 && s[2] > s[1] && s[1] > s[0]);
        let norm = Norm {
            w: vec![1.0; 4],
            b: vec![0.0; 4],
        };
        let mut x = [1.0, 2.0, 3.0, 4.0];
        layer_norm(&mut x, &norm, 4, 1e-12);
        assert!(x.iter().sum::<f32>().abs() < 1e-5);
        assert!((x.iter().map(|v| v * v).sum::<f32>() / 4.0 - 1.0).abs() < 1e-4);
    }
}
