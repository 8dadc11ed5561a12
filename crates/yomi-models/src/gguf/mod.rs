//! GGUF v2/v3 reader over a memory map (own parser; no GGUF crate).
//!
//! File layout (all little-endian):
//!
//! ```text
//! magic        4 bytes  "GGUF"
//! version      u32      2 or 3 (v1 used u32 counts and is not supported; v3 only added
//!                       big-endian files, which are rejected as an unsupported version)
//! tensor_count u64
//! kv_count     u64
//! kv_count ×   { key: string, value_type: u32, value }
//! tensor_count × { name: string, n_dims: u32, ne: u64 × n_dims, type: u32, offset: u64 }
//! padding      to `general.alignment` (default 32)
//! data         tensor i at data_start + offset_i (a multiple of the alignment)
//!
//! string = u64 byte length + UTF-8 bytes (no terminator)
//! value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (1 byte), 8 string,
//!              9 array { element type: u32, count: u64, elements }, 10 u64, 11 i64, 12 f64
//! ```
//!
//! `ne` is in ggml order (`ne[0]` = the contiguous dimension, i.e. columns); [`TensorInfo::shape`]
//! is the PyTorch order (reversed): `[rows, cols]` for a matrix.
//!
//! Every size and count read from the file is checked against the bytes that remain before
//! anything is allocated, and every tensor's type, shape, alignment and byte range is validated
//! at [`GgufFile::open`]; a malformed file gives a [`GgufError`], never a panic.

mod parse;
pub mod q5;
#[cfg(test)]
pub(crate) mod tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// A ggml tensor type this reader accepts.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    /// Read and turned into Q8_0 at load ([`q5`]).
    Q5_0,
    /// Read and turned into f32 at load ([`q5`]).
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    BF16,
}

impl TensorType {
    pub const ALL: [TensorType; 11] = [
        TensorType::F32,
        TensorType::F16,
        TensorType::Q4_0,
        TensorType::Q4_1,
        TensorType::Q5_0,
        TensorType::Q5_1,
        TensorType::Q8_0,
        TensorType::Q4_K,
        TensorType::Q5_K,
        TensorType::Q6_K,
        TensorType::BF16,
    ];

    /// The `ggml_type` id stored in the file.
    pub const fn id(self) -> u32 {
        match self {
            TensorType::F32 => 0,
            TensorType::F16 => 1,
            TensorType::Q4_0 => 2,
            TensorType::Q4_1 => 3,
            TensorType::Q5_0 => 6,
            TensorType::Q5_1 => 7,
            TensorType::Q8_0 => 8,
            TensorType::Q4_K => 12,
            TensorType::Q5_K => 13,
            TensorType::Q6_K => 14,
            TensorType::BF16 => 30,
        }
    }

    pub fn from_id(id: u32) -> Option<TensorType> {
        TensorType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// Values per block (1 for the float types).
    pub const fn block_size(self) -> usize {
        match self {
            TensorType::F32 | TensorType::F16 | TensorType::BF16 => 1,
            TensorType::Q4_0
            | TensorType::Q4_1
            | TensorType::Q5_0
            | TensorType::Q5_1
            | TensorType::Q8_0 => 32,
            TensorType::Q4_K | TensorType::Q5_K | TensorType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            TensorType::F32 => 4,
            TensorType::F16 | TensorType::BF16 => 2,
            TensorType::Q4_0 => 18,
            TensorType::Q4_1 => 20,
            TensorType::Q5_0 => q5::Q5_0_BYTES,
            TensorType::Q5_1 => q5::Q5_1_BYTES,
            TensorType::Q8_0 => 34,
            TensorType::Q4_K => 144,
            TensorType::Q5_K => 176,
            TensorType::Q6_K => 210,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "F32",
            TensorType::F16 => "F16",
            TensorType::Q4_0 => "Q4_0",
            TensorType::Q4_1 => "Q4_1",
            TensorType::Q5_0 => "Q5_0",
            TensorType::Q5_1 => "Q5_1",
            TensorType::Q8_0 => "Q8_0",
            TensorType::Q4_K => "Q4_K",
            TensorType::Q5_K => "Q5_K",
            TensorType::Q6_K => "Q6_K",
            TensorType::BF16 => "BF16",
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's name for a type id this reader does not accept (for error messages).
fn ggml_type_name(id: u32) -> Option<&'static str> {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    NAMES.get(id as usize).copied()
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array (typed by its element type).
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufValue {
    /// The GGUF name of the value's type (`"u32"`, `"string"`, `"array[i32]"`, …).
    pub fn type_name(&self) -> String {
        match self {
            GgufValue::Array(a) => format!("array[{}]", a.element_type_name()),
            v => v.scalar_type_name().to_string(),
        }
    }

    fn scalar_type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
        }
    }

    /// The value as an integer if it is one (any width, signed or not).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v as i128,
            GgufValue::I8(v) => v as i128,
            GgufValue::U16(v) => v as i128,
            GgufValue::I16(v) => v as i128,
            GgufValue::U32(v) => v as i128,
            GgufValue::I32(v) => v as i128,
            GgufValue::U64(v) => v as i128,
            GgufValue::I64(v) => v as i128,
            _ => return None,
        })
    }
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the element type.
    pub fn element_type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "u8",
            GgufArray::I8(_) => "i8",
            GgufArray::U16(_) => "u16",
            GgufArray::I16(_) => "i16",
            GgufArray::U32(_) => "u32",
            GgufArray::I32(_) => "i32",
            GgufArray::F32(_) => "f32",
            GgufArray::Bool(_) => "bool",
            GgufArray::String(_) => "string",
            GgufArray::Array(_) => "array",
            GgufArray::U64(_) => "u64",
            GgufArray::I64(_) => "i64",
            GgufArray::F64(_) => "f64",
        }
    }

    /// Every element as i128 when the elements are integers.
    fn ints(&self) -> Option<Vec<i128>> {
        Some(match self {
            GgufArray::U8(v) => v.iter().map(|&x| x as i128).collect(),
            GgufArray::I8(v) => v.iter().map(|&x| x as i128).collect(),
            GgufArray::U16(v) => v.iter().map(|&x| x as i128).collect(),
            GgufArray::I16(v) => v.iter().map(|&x| x as i128).collect(),
            GgufArray::U32(v) => v.iter().map(|&x| x as i128).collect(),
            GgufArray::I32(v) => v.iter().map(|&x| x as i128).collect(),
            GgufArray::U64(v) => v.iter().map(|&x| x as i128).collect(),
            GgufArray::I64(v) => v.iter().map(|&x| x as i128).collect(),
            _ => return None,
        })
    }
}

/// One tensor's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// PyTorch order (the reverse of ggml's `ne`): `[rows, cols]` for a matrix.
    pub shape: Vec<usize>,
    pub ty: TensorType,
    /// Offset from the start of the data section, as stored.
    pub offset: u64,
    /// Absolute byte range of the data in the file.
    pub range: Range<usize>,
}

impl TensorInfo {
    /// ggml's `ne` (shape reversed; `ne[0]` is the contiguous dimension).
    pub fn ne(&self) -> Vec<usize> {
        self.shape.iter().rev().copied().collect()
    }

    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn n_bytes(&self) -> usize {
        self.range.len()
    }
}

/// Why a GGUF file could not be read, or a metadata key not be used.
#[derive(Debug)]
pub enum GgufError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file ends inside `what`, which starts at byte `offset` and needs `needed` bytes.
    Truncated {
        what: String,
        offset: usize,
        needed: u64,
        file_len: usize,
    },
    BadMagic {
        found: Vec<u8>,
    },
    UnsupportedVersion(u32),
    UnknownValueType {
        what: String,
        id: u32,
    },
    UnknownTensorType {
        tensor: String,
        id: u32,
    },
    BadUtf8 {
        what: String,
        offset: usize,
    },
    TensorOutOfBounds {
        tensor: String,
        start: u128,
        end: u128,
        file_len: usize,
    },
    MisalignedOffset {
        tensor: String,
        offset: u64,
        alignment: usize,
    },
    BadAlignment {
        value: String,
    },
    BadTensorShape {
        tensor: String,
        reason: String,
    },
    DuplicateKey(String),
    DuplicateTensor(String),
    NestedTooDeep {
        what: String,
    },
    MissingKey(String),
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    OutOfRange {
        key: String,
        target: &'static str,
    },
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufError::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            GgufError::Truncated {
                what,
                offset,
                needed,
                file_len,
            } => write!(
                f,
                "GGUF file truncated: {what} at byte {offset} needs {needed} bytes, but the file \
                 ends at byte {file_len}"
            ),
            GgufError::BadMagic { found } => write!(
                f,
                "not a GGUF file: magic is {found:02x?} ({:?}), expected \"GGUF\"",
                String::from_utf8_lossy(found)
            ),
            GgufError::UnsupportedVersion(v) => {
                write!(f, "unsupported GGUF version {v} (supported: 2, 3)")?;
                if matches!(v.swap_bytes(), 2 | 3) {
                    write!(f, "; this looks like a big-endian GGUF file")?;
                }
                Ok(())
            }
            GgufError::UnknownValueType { what, id } => {
                write!(f, "{what} has unknown GGUF value type id {id}")
            }
            GgufError::UnknownTensorType { tensor, id } => match ggml_type_name(*id) {
                Some(n) => write!(
                    f,
                    "tensor '{tensor}' has ggml type {n} (id {id}), which is not supported \
                     (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
                ),
                None => write!(f, "tensor '{tensor}' has unknown ggml type id {id}"),
            },
            GgufError::BadUtf8 { what, offset } => {
                write!(f, "{what} at byte {offset} is not valid UTF-8")
            }
            GgufError::TensorOutOfBounds {
                tensor,
                start,
                end,
                file_len,
            } => write!(
                f,
                "tensor '{tensor}' data [{start}, {end}) lies outside the file ({file_len} bytes)"
            ),
            GgufError::MisalignedOffset {
                tensor,
                offset,
                alignment,
            } => write!(
                f,
                "tensor '{tensor}' data offset {offset} is not a multiple of the alignment \
                 {alignment}"
            ),
            GgufError::BadAlignment { value } => {
                write!(
                    f,
                    "general.alignment must be a power of two that fits u32, got {value}"
                )
            }
            GgufError::BadTensorShape { tensor, reason } => {
                write!(f, "tensor '{tensor}' has a bad shape: {reason}")
            }
            GgufError::DuplicateKey(k) => write!(f, "metadata key '{k}' appears twice"),
            GgufError::DuplicateTensor(t) => write!(f, "tensor '{t}' appears twice"),
            GgufError::NestedTooDeep { what } => {
                write!(
                    f,
                    "{what}: arrays nested more than {} deep",
                    parse::MAX_DEPTH
                )
            }
            GgufError::MissingKey(k) => write!(f, "GGUF metadata key '{k}' is missing"),
            GgufError::WrongType {
                key,
                expected,
                found,
            } => {
                write!(
                    f,
                    "GGUF metadata key '{key}' is {found}, expected {expected}"
                )
            }
            GgufError::OutOfRange { key, target } => {
                write!(f, "GGUF metadata key '{key}' does not fit {target}")
            }
        }
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GgufError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `madvise(MADV_DONTNEED)` over a read-only file mapping: its pages leave the process and are
/// faulted in from the file again if read, with the same contents.
pub(crate) fn drop_pages(m: &memmap2::Mmap) {
    #[cfg(unix)]
    // SAFETY: the map is a read-only private file mapping that is never written, so dropping
    // its pages cannot change what a later read sees (they come back from the unchanged file);
    // no reference into the map outlives a page's content. A failure only keeps the pages.
    unsafe {
        let _ = m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed);
    }
    #[cfg(not(unix))]
    let _ = m;
}

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open GGUF file: parsed metadata and tensor infos, tensor data borrowed from the map.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    alignment: usize,
    data_offset: usize,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("len", &self.storage.bytes().len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this process. Mapping a file is
            // inherently unsafe in Rust because another process could modify or truncate it
            // while mapped; like every mmap-based model loader we accept that (the file is a
            // model the user handed us, not expected to change underneath).
            Storage::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::parse(storage)
    }

    /// Lets the OS drop the mapped pages read so far (they are read from the file again if
    /// touched): a loader that copies tensors out as it goes keeps the file from staying
    /// resident next to the copies. No effect on an image held in memory.
    pub fn drop_resident_pages(&self) {
        if let Storage::Mmap(m) = &self.storage {
            drop_pages(m);
        }
    }

    /// Parse a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<GgufFile, GgufError> {
        let p = parse::parse(storage.bytes())?;
        Ok(GgufFile {
            storage,
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            key_index: p
                .metadata
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            metadata: p.metadata,
            tensor_index: p
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: p.tensors,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or [`DEFAULT_ALIGNMENT`].
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn need(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, v: &GgufValue) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_name(),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.need(key)? {
            GgufValue::String(s) => Ok(s),
            v => Err(Self::wrong(key, "a string", v)),
        }
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, target: &'static str) -> Result<T, GgufError> {
        let v = self.need(key)?;
        let i = v
            .as_i128()
            .ok_or_else(|| Self::wrong(key, "an integer", v))?;
        T::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            target,
        })
    }

    /// An integer of any width and signedness that fits u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_int(key, "u32")
    }

    /// An integer of any width and signedness that fits u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_int(key, "u64")
    }

    /// An integer of any width and signedness that fits i64.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.get_int(key, "i64")
    }

    /// An f32 or f64 (rounded to f32), or any integer (converted).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.need(key)? {
            GgufValue::F32(x) => Ok(*x),
            GgufValue::F64(x) => Ok(*x as f32),
            v => v
                .as_i128()
                .map(|i| i as f32)
                .ok_or_else(|| Self::wrong(key, "a number", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.need(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(Self::wrong(key, "a bool", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&GgufArray, GgufError> {
        match self.need(key)? {
            GgufValue::Array(a) => Ok(a),
            v => Err(Self::wrong(key, "an array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.need(key)? {
            GgufValue::Array(GgufArray::String(v)) => Ok(v),
            v => Err(Self::wrong(key, "an array of strings", v)),
        }
    }

    /// An array of integers of any width whose every element fits i32 (borrowed when the
    /// file stores i32).
    pub fn get_i32_array(&self, key: &str) -> Result<Cow<'_, [i32]>, GgufError> {
        let v = self.need(key)?;
        let GgufValue::Array(a) = v else {
            return Err(Self::wrong(key, "an array of integers", v));
        };
        if let GgufArray::I32(x) = a {
            return Ok(Cow::Borrowed(x));
        }
        let ints = a
            .ints()
            .ok_or_else(|| Self::wrong(key, "an array of integers", v))?;
        ints.into_iter()
            .map(i32::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map(Cow::Owned)
            .map_err(|_| GgufError::OutOfRange {
                key: key.to_string(),
                target: "i32",
            })
    }

    /// An array of f32 (borrowed), f64 (rounded) or integers (converted).
    pub fn get_f32_array(&self, key: &str) -> Result<Cow<'_, [f32]>, GgufError> {
        let v = self.need(key)?;
        match v {
            GgufValue::Array(GgufArray::F32(x)) => Ok(Cow::Borrowed(x)),
            GgufValue::Array(GgufArray::F64(x)) => {
                Ok(Cow::Owned(x.iter().map(|&f| f as f32).collect()))
            }
            GgufValue::Array(a) => a
                .ints()
                .map(|v| Cow::Owned(v.into_iter().map(|i| i as f32).collect()))
                .ok_or_else(|| Self::wrong(key, "an array of numbers", v)),
            v => Err(Self::wrong(key, "an array of numbers", v)),
        }
    }

    /// `general.architecture` (e.g. "llama", "qwen3").
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of a tensor of this file (its range was validated at open).
    ///
    /// Panics if `info` did not come from this file and its range lies outside it.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        match self.bytes().get(info.range.clone()) {
            Some(b) => b,
            None => panic!(
                "tensor_bytes: '{}' is not a tensor of this GGUF file",
                info.name
            ),
        }
    }
}
