//! Byte-level GGUF parsing (layout in the parent module's header). Every read is bounds-checked;
//! every count is checked against the remaining bytes before anything is allocated.

use std::collections::HashSet;
use std::fmt;

use super::{DEFAULT_ALIGNMENT, GgufArray, GgufError, GgufValue, TensorInfo, TensorType};

/// Deepest array nesting accepted (arrays of arrays of …).
pub(super) const MAX_DEPTH: usize = 8;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;

pub(super) struct Parsed {
    pub version: u32,
    pub alignment: usize,
    pub data_offset: usize,
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<TensorInfo>,
}

/// Where the parser is, for error messages (formatted only when an error happens).
#[derive(Clone, Copy)]
enum Place<'a> {
    Header(&'static str),
    KeyName(u64),
    ValueType(&'a str),
    Value(&'a str),
    ArrayHeader(&'a str),
    ArrayElem(&'a str, u64),
    TensorName(u64),
    TensorField(&'a str, &'static str),
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Header(h) => write!(f, "header field {h}"),
            Place::KeyName(i) => write!(f, "the key of metadata entry {i}"),
            Place::ValueType(k) => write!(f, "the value type of metadata key '{k}'"),
            Place::Value(k) => write!(f, "the value of metadata key '{k}'"),
            Place::ArrayHeader(k) => write!(f, "the array header of metadata key '{k}'"),
            Place::ArrayElem(k, i) => write!(f, "element {i} of metadata array '{k}'"),
            Place::TensorName(i) => write!(f, "the name of tensor info {i}"),
            Place::TensorField(n, fl) => write!(f, "field {fl} of tensor info '{n}'"),
        }
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    fn truncated(&self, what: String, needed: u64) -> GgufError {
        GgufError::Truncated {
            what,
            offset: self.pos,
            needed,
            file_len: self.b.len(),
        }
    }

    fn take(&mut self, n: u64, place: Place<'_>) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(self.truncated(place.to_string(), n));
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u32(&mut self, place: Place<'_>) -> Result<u32, GgufError> {
        let s = self.take(4, place)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self, place: Place<'_>) -> Result<u64, GgufError> {
        let s = self.take(8, place)?;
        Ok(u64::from_le_bytes([
            s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
        ]))
    }

    fn string(&mut self, place: Place<'_>) -> Result<String, GgufError> {
        let n = self.u64(place)?;
        let start = self.pos;
        let s = self.take(n, place)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::BadUtf8 {
                what: place.to_string(),
                offset: start,
            }),
        }
    }
}

fn le16(s: &[u8]) -> [u8; 2] {
    [s[0], s[1]]
}
fn le32(s: &[u8]) -> [u8; 4] {
    [s[0], s[1], s[2], s[3]]
}
fn le64(s: &[u8]) -> [u8; 8] {
    [s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]
}

/// Smallest encoded size of one value of GGUF type `ty` (None: unknown type).
fn min_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,  // u64 length
        9 => 12, // element type + count
        _ => return None,
    })
}

fn value(c: &mut Cursor<'_>, ty: u32, key: &str, depth: usize) -> Result<GgufValue, GgufError> {
    let p = Place::Value(key);
    Ok(match ty {
        0 => GgufValue::U8(c.take(1, p)?[0]),
        1 => GgufValue::I8(c.take(1, p)?[0] as i8),
        2 => GgufValue::U16(u16::from_le_bytes(le16(c.take(2, p)?))),
        3 => GgufValue::I16(i16::from_le_bytes(le16(c.take(2, p)?))),
        4 => GgufValue::U32(c.u32(p)?),
        5 => GgufValue::I32(c.u32(p)? as i32),
        6 => GgufValue::F32(f32::from_bits(c.u32(p)?)),
        7 => GgufValue::Bool(c.take(1, p)?[0] != 0),
        8 => GgufValue::String(c.string(p)?),
        9 => GgufValue::Array(array(c, key, depth)?),
        10 => GgufValue::U64(c.u64(p)?),
        11 => GgufValue::I64(c.u64(p)? as i64),
        12 => GgufValue::F64(f64::from_bits(c.u64(p)?)),
        id => {
            return Err(GgufError::UnknownValueType {
                what: format!("metadata key '{key}'"),
                id,
            });
        }
    })
}

fn array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<GgufArray, GgufError> {
    if depth >= MAX_DEPTH {
        return Err(GgufError::NestedTooDeep {
            what: format!("metadata key '{key}'"),
        });
    }
    let et = c.u32(Place::ArrayHeader(key))?;
    let n = c.u64(Place::ArrayHeader(key))?;
    let Some(min) = min_size(et) else {
        return Err(GgufError::UnknownValueType {
            what: format!("the elements of metadata array '{key}'"),
            id: et,
        });
    };
    // Check the count against the bytes left before allocating anything for it.
    let need = n.saturating_mul(min);
    if need > c.remaining() as u64 {
        return Err(c.truncated(format!("metadata array '{key}' ({n} elements)"), need));
    }
    let n_us = n as usize; // ≤ remaining bytes, so it fits
    let p = Place::Value(key);
    Ok(match et {
        0 => GgufArray::U8(c.take(n, p)?.to_vec()),
        1 => GgufArray::I8(c.take(n, p)?.iter().map(|&b| b as i8).collect()),
        2 => GgufArray::U16(
            c.take(2 * n, p)?
                .chunks_exact(2)
                .map(|s| u16::from_le_bytes(le16(s)))
                .collect(),
        ),
        3 => GgufArray::I16(
            c.take(2 * n, p)?
                .chunks_exact(2)
                .map(|s| i16::from_le_bytes(le16(s)))
                .collect(),
        ),
        4 => GgufArray::U32(
            c.take(4 * n, p)?
                .chunks_exact(4)
                .map(|s| u32::from_le_bytes(le32(s)))
                .collect(),
        ),
        5 => GgufArray::I32(
            c.take(4 * n, p)?
                .chunks_exact(4)
                .map(|s| i32::from_le_bytes(le32(s)))
                .collect(),
        ),
        6 => GgufArray::F32(
            c.take(4 * n, p)?
                .chunks_exact(4)
                .map(|s| f32::from_le_bytes(le32(s)))
                .collect(),
        ),
        7 => GgufArray::Bool(c.take(n, p)?.iter().map(|&b| b != 0).collect()),
        10 => GgufArray::U64(
            c.take(8 * n, p)?
                .chunks_exact(8)
                .map(|s| u64::from_le_bytes(le64(s)))
                .collect(),
        ),
        11 => GgufArray::I64(
            c.take(8 * n, p)?
                .chunks_exact(8)
                .map(|s| i64::from_le_bytes(le64(s)))
                .collect(),
        ),
        12 => GgufArray::F64(
            c.take(8 * n, p)?
                .chunks_exact(8)
                .map(|s| f64::from_le_bytes(le64(s)))
                .collect(),
        ),
        8 => {
            let mut v = Vec::with_capacity(n_us);
            for i in 0..n {
                v.push(c.string(Place::ArrayElem(key, i))?);
            }
            GgufArray::String(v)
        }
        _ => {
            // et == 9: nested arrays.
            let mut v = Vec::with_capacity(n_us);
            for _ in 0..n {
                v.push(array(c, key, depth + 1)?);
            }
            GgufArray::Array(v)
        }
    })
}

fn alignment_of(v: &GgufValue) -> Result<usize, GgufError> {
    match v.as_i128() {
        Some(a) if a > 0 && a <= u32::MAX as i128 && (a as u64).is_power_of_two() => Ok(a as usize),
        _ => Err(GgufError::BadAlignment {
            value: format!("{v:?}"),
        }),
    }
}

pub(super) fn parse(b: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { b, pos: 0 };
    let magic = c.take(4, Place::Header("magic"))?;
    if magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = c.u32(Place::Header("version"))?;
    if !matches!(version, 2 | 3) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(Place::Header("tensor_count"))?;
    let n_kv = c.u64(Place::Header("metadata_kv_count"))?;
    // A kv takes ≥ 13 bytes (key length, value type, a 1-byte value), a tensor info ≥ 24.
    let need = n_kv
        .saturating_mul(13)
        .saturating_add(n_tensors.saturating_mul(24));
    if need > c.remaining() as u64 {
        return Err(c.truncated(
            format!("{n_kv} metadata entries and {n_tensors} tensor infos"),
            need,
        ));
    }

    let mut metadata: Vec<(String, GgufValue)> = Vec::with_capacity(n_kv as usize);
    let mut keys = HashSet::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(Place::KeyName(i))?;
        let ty = c.u32(Place::ValueType(&key))?;
        let v = value(&mut c, ty, &key, 0)?;
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey(key));
        }
        metadata.push((key, v));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        Some((_, v)) => alignment_of(v)?,
        None => DEFAULT_ALIGNMENT,
    };

    struct Raw {
        name: String,
        ne: Vec<u64>,
        ty: TensorType,
        offset: u64,
        n_bytes: u128,
    }
    let mut raw = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(Place::TensorName(i))?;
        let n_dims = c.u32(Place::TensorField(&name, "n_dims"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::BadTensorShape {
                tensor: name,
                reason: format!("{n_dims} dimensions (at most {MAX_DIMS})"),
            });
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64(Place::TensorField(&name, "ne"))?);
        }
        let ty_id = c.u32(Place::TensorField(&name, "type"))?;
        let offset = c.u64(Place::TensorField(&name, "offset"))?;
        let Some(ty) = TensorType::from_id(ty_id) else {
            return Err(GgufError::UnknownTensorType {
                tensor: name,
                id: ty_id,
            });
        };
        let bs = ty.block_size() as u64;
        let ne0 = ne.first().copied().unwrap_or(1);
        if ne0 % bs != 0 {
            return Err(GgufError::BadTensorShape {
                tensor: name,
                reason: format!("ne[0] = {ne0} is not a multiple of the {ty} block size {bs}"),
            });
        }
        // Product of ≤ 4 u64 dimensions, in checked u128.
        let mut n_el: u128 = 1;
        for &d in &ne {
            n_el = n_el
                .checked_mul(d as u128)
                .ok_or_else(|| GgufError::BadTensorShape {
                    tensor: name.clone(),
                    reason: format!("element count of {ne:?} overflows"),
                })?;
        }
        let n_bytes = n_el / bs as u128 * ty.type_size() as u128;
        if offset % alignment as u64 != 0 {
            return Err(GgufError::MisalignedOffset {
                tensor: name,
                offset,
                alignment,
            });
        }
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor(name));
        }
        raw.push(Raw {
            name,
            ne,
            ty,
            offset,
            n_bytes,
        });
    }

    let data_offset = c.pos.div_ceil(alignment) * alignment;
    let file_len = b.len();
    let mut tensors = Vec::with_capacity(raw.len());
    for r in raw {
        let start = data_offset as u128 + r.offset as u128;
        let end = start + r.n_bytes;
        if end > file_len as u128 {
            return Err(GgufError::TensorOutOfBounds {
                tensor: r.name,
                start,
                end,
                file_len,
            });
        }
        let mut shape = Vec::with_capacity(r.ne.len());
        for &d in r.ne.iter().rev() {
            match usize::try_from(d) {
                Ok(d) => shape.push(d),
                Err(_) => {
                    return Err(GgufError::BadTensorShape {
                        tensor: r.name,
                        reason: format!("dimension {d} does not fit usize"),
                    });
                }
            }
        }
        tensors.push(TensorInfo {
            name: r.name,
            shape,
            ty: r.ty,
            offset: r.offset,
            range: start as usize..end as usize,
        });
    }
    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}
