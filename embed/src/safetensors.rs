//! The safetensors format, read strictly: an 8-byte little-endian header length, a JSON header
//! naming each tensor's dtype, shape and byte range, then the data. Only what the encoder needs:
//! `F32` tensors, every range inside the file and matching its shape.

use std::collections::HashMap;

use serde::Deserialize;

use crate::LoadError;

/// Largest JSON header accepted (the format's own limit is 100 MB; a BERT's is a few KB).
const MAX_HEADER: u64 = 1 << 20;

#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// The tensors of one file, by name.
pub struct Tensors {
    bytes: Vec<u8>,
    /// Start of the data section in `bytes`.
    data: usize,
    entries: HashMap<String, Entry>,
}

impl Tensors {
    pub fn parse(bytes: Vec<u8>) -> Result<Tensors, LoadError> {
        let bad = |m: &str| LoadError::Format(format!("model.safetensors: {m}"));
        let len: [u8; 8] = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| bad("shorter than its header"))?;
        let len = u64::from_le_bytes(len);
        if len > MAX_HEADER || 8 + len > bytes.len() as u64 {
            return Err(bad("header length out of range"));
        }
        let data = 8 + len as usize;
        let header: HashMap<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..data]).map_err(|e| bad(&e.to_string()))?;
        let mut entries = HashMap::new();
        for (name, v) in header {
            if name == "__metadata__" {
                continue;
            }
            let e: Entry = serde_json::from_value(v).map_err(|e| bad(&format!("{name}: {e}")))?;
            let [start, end] = e.data_offsets;
            if start > end || data.checked_add(end).is_none_or(|end| end > bytes.len()) {
                return Err(bad(&format!("{name}: data outside the file")));
            }
            entries.insert(name, e);
        }
        Ok(Tensors {
            bytes,
            data,
            entries,
        })
    }

    /// Tensor `name` as `f32`s, checked to have `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| LoadError::Format(format!("model.safetensors: no tensor {name}")))?;
        if e.dtype != "F32" || e.shape != shape {
            return Err(LoadError::Format(format!(
                "model.safetensors: {name} is {} {:?}, expected F32 {shape:?}",
                e.dtype, e.shape
            )));
        }
        let [start, end] = e.data_offsets;
        let count: usize = shape.iter().product();
        if end - start != count * 4 {
            return Err(LoadError::Format(format!(
                "model.safetensors: {name}: {} bytes for {count} values",
                end - start
            )));
        }
        Ok(self.bytes[self.data + start..self.data + end]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Whether a tensor of that name exists.
    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn reads_f32_tensors_and_refuses_what_does_not_fit() {
        let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let t = Tensors::parse(file(
            r#"{"__metadata__":{},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#,
            &data,
        ))
        .unwrap();
        assert_eq!(t.f32("w", &[2, 2]).unwrap(), [1.0, 2.0, 3.0, 4.0]);
        assert!(t.f32("w", &[4]).is_err());
        assert!(t.f32("v", &[2, 2]).is_err());
        // A range past the end of the file, a header longer than the file, a truncated file.
        assert!(Tensors::parse(file(
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,17]}}"#,
            &data
        ))
        .is_err());
        let mut long = file("{}", &[]);
        long[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(Tensors::parse(long).is_err());
        assert!(Tensors::parse(vec![1, 2, 3]).is_err());
        // Wrong dtype.
        let t = Tensors::parse(file(
            r#"{"w":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]}}"#,
            &data,
        ))
        .unwrap();
        assert!(t.f32("w", &[2, 4]).is_err());
    }
}
