//! The model's weights, read with Hugging Face's `safetensors` crate (which checks the header, that
//! every tensor's byte range lies in the file, matches its dtype and shape, and that the ranges
//! neither overlap nor leave holes). Here: only `F32` tensors of the shape the encoder expects.

use safetensors::{Dtype, SafeTensors};

use crate::LoadError;

/// The tensors of one file, by name (borrowing the file's bytes).
pub struct Tensors<'a>(SafeTensors<'a>);

impl<'a> Tensors<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Tensors<'a>, LoadError> {
        SafeTensors::deserialize(bytes)
            .map(Tensors)
            .map_err(|e| LoadError::Format(format!("model.safetensors: {e}")))
    }

    /// Tensor `name` as `f32`s, checked to have `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let t = self
            .0
            .tensor(name)
            .map_err(|_| LoadError::Format(format!("model.safetensors: no tensor {name}")))?;
        if t.dtype() != Dtype::F32 || t.shape() != shape {
            return Err(LoadError::Format(format!(
                "model.safetensors: {name} is {:?} {:?}, expected F32 {shape:?}",
                t.dtype(),
                t.shape()
            )));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Whether a tensor of that name exists.
    pub fn has(&self, name: &str) -> bool {
        self.0.tensor(name).is_ok()
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
        let bytes = file(
            r#"{"__metadata__":{},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#,
            &data,
        );
        let t = Tensors::parse(&bytes).unwrap();
        assert_eq!(t.f32("w", &[2, 2]).unwrap(), [1.0, 2.0, 3.0, 4.0]);
        assert!(t.has("w") && !t.has("v"));
        assert!(t.f32("w", &[4]).is_err());
        assert!(t.f32("v", &[2, 2]).is_err());
        // A range past the end of the file, a header longer than the file, a truncated file.
        let bytes = file(
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,17]}}"#,
            &data,
        );
        assert!(Tensors::parse(&bytes).is_err());
        let mut long = file("{}", &[]);
        long[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(Tensors::parse(&long).is_err());
        assert!(Tensors::parse(&[1, 2, 3]).is_err());
        // A range that does not match its shape.
        let bytes = file(
            r#"{"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,16]}}"#,
            &data,
        );
        assert!(Tensors::parse(&bytes).is_err());
        // Wrong dtype.
        let bytes = file(
            r#"{"w":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]}}"#,
            &data,
        );
        assert!(Tensors::parse(&bytes).unwrap().f32("w", &[2, 4]).is_err());
    }
}
