//! Where a chunk's payload bytes live: host memory the chunk owns (the default), or memory
//! someone else owns and lends for the chunk's lifetime, such as device memory the host writes
//! through a mapping (`--use-vkgdr`: the consumer then reads the chunk on the device and the
//! host only writes it). The receive path writes either through the raw pointer it takes once
//! per chunk ([`super::chunk_group`]), so neither costs anything per packet.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// `len` bytes lent to one chunk, kept valid by `owner`.
pub struct ExternalBuffer {
    ptr: NonNull<u8>,
    len: usize,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the bytes are plain memory reachable only through this buffer (its constructor's
// contract); `&`/`&mut` access follows the buffer's own borrows.
unsafe impl Send for ExternalBuffer {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for ExternalBuffer {}

impl ExternalBuffer {
    /// Lend `len` bytes at `ptr` to a chunk.
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes, suitably for `&[u8]`/`&mut [u8]`,
    /// while `owner` lives, and nothing but this buffer reaches those bytes (buffers made from
    /// one allocation do not overlap).
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Option<ExternalBuffer> {
        Some(ExternalBuffer {
            ptr: NonNull::new(ptr)?,
            len,
            _owner: owner,
        })
    }
}

impl ExternalBuffer {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for ExternalBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExternalBuffer({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// A chunk's payload memory.
#[derive(Debug)]
pub enum ChunkData {
    Owned(Box<[u8]>),
    External(ExternalBuffer),
}

impl ChunkData {
    /// Whether the memory is lent ([`ChunkData::External`]).
    pub fn is_external(&self) -> bool {
        matches!(self, ChunkData::External(_))
    }
}

impl From<Box<[u8]>> for ChunkData {
    fn from(b: Box<[u8]>) -> ChunkData {
        ChunkData::Owned(b)
    }
}

impl Deref for ChunkData {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            ChunkData::Owned(b) => b,
            // SAFETY: valid for `len` bytes while the owner, which the buffer holds, lives
            // (`ExternalBuffer::new`'s contract); borrowed from `self`.
            ChunkData::External(e) => unsafe { std::slice::from_raw_parts(e.ptr.as_ptr(), e.len) },
        }
    }
}

impl DerefMut for ChunkData {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            ChunkData::Owned(b) => b,
            // SAFETY: as for `deref`, and only this buffer reaches the bytes, borrowed
            // mutably from `self`.
            ChunkData::External(e) => unsafe {
                std::slice::from_raw_parts_mut(e.ptr.as_ptr(), e.len)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocation reached only through raw pointers, as device memory's mapping is.
    struct Raw(*mut [u8]);
    // SAFETY: the test's threads never share it.
    unsafe impl Send for Raw {}
    // SAFETY: as above.
    unsafe impl Sync for Raw {}
    impl Drop for Raw {
        fn drop(&mut self) {
            // SAFETY: made by Box::into_raw below, freed once.
            drop(unsafe { Box::from_raw(self.0) });
        }
    }

    /// A lent buffer reads and writes its owner's bytes and keeps the owner alive.
    #[test]
    fn lent_memory_is_the_owners() {
        let raw: *mut [u8] = Box::into_raw(vec![7u8; 64].into_boxed_slice());
        let base = raw.cast::<u8>();
        let owner = Arc::new(Raw(raw));
        // SAFETY: bytes 16..48 of the allocation are reached only through `data`.
        let buffer = unsafe { ExternalBuffer::new(base.add(16), 32, owner.clone()) }.unwrap();
        let mut data = ChunkData::External(buffer);
        assert!(data.is_external());
        assert_eq!(Arc::strong_count(&owner), 2);
        data[..4].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!((data.len(), &data[..5]), (32, &[1u8, 2, 3, 4, 7][..]));
        drop(data);
        assert_eq!(Arc::strong_count(&owner), 1);
        // SAFETY: nothing else reaches the allocation now.
        let all = unsafe { std::slice::from_raw_parts(base, 64) };
        assert_eq!(&all[15..21], &[7, 1, 2, 3, 4, 7]);
        // SAFETY: a null pointer is refused before anything is lent.
        assert!(unsafe { ExternalBuffer::new(std::ptr::null_mut(), 1, owner.clone()) }.is_none());
    }
}
