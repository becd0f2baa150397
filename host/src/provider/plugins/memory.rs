//! Memory a plugin call may hold: one budget per call, counting every linear memory and table of
//! its store (a component of several core instances has several memories, and each used to get
//! the whole limit), and one total for every call in flight, so the plugins together stay within
//! what the operator's container is given.
//!
//! The total is accounted from what live calls hold, not from the worst case: 64 pool slots ×
//! 128 MiB would be 8 GiB, so a static product would leave only two or three calls at a time
//! inside a 512 MiB container, while plugins hold a few MiB each in practice.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes a table element is counted as (a pointer-sized function reference).
const TABLE_ELEMENT_BYTES: usize = 8;
/// Elements one table may have, whatever the budget left.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// The memory every plugin call in flight holds together, and its ceiling.
#[derive(Debug)]
pub struct MemoryTotal {
    ceiling: usize,
    held: AtomicUsize,
}

impl MemoryTotal {
    pub fn new(ceiling: usize) -> Arc<Self> {
        Arc::new(MemoryTotal {
            ceiling,
            held: AtomicUsize::new(0),
        })
    }

    pub fn ceiling(&self) -> usize {
        self.ceiling
    }

    /// Bytes held by the calls in flight.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if the ceiling allows.
    fn take(&self, bytes: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|sum| *sum <= self.ceiling)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Which bound a call hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBound {
    /// The call's own budget (`--plugin-memory-limit-mib`).
    Call,
    /// The total of all calls in flight (`--plugin-memory-total-mib`).
    Total,
}

/// The limiter of one call's store; what it took from the total goes back when the store goes.
pub struct MemoryLimiter {
    pub(crate) limit: usize,
    total: Arc<MemoryTotal>,
    held: usize,
    pub(crate) hit: Option<MemoryBound>,
}

impl MemoryLimiter {
    pub fn new(limit: usize, total: Arc<MemoryTotal>) -> Self {
        MemoryLimiter {
            limit,
            total,
            held: 0,
            hit: None,
        }
    }

    pub fn total(&self) -> &MemoryTotal {
        &self.total
    }

    /// Grows the call's holding by `extra` bytes, or says which bound stops it.
    fn grow(&mut self, extra: usize) -> Result<(), MemoryBound> {
        let wanted = self.held.saturating_add(extra);
        if wanted > self.limit {
            return Err(MemoryBound::Call);
        }
        if !self.total.take(extra) {
            return Err(MemoryBound::Total);
        }
        self.held = wanted;
        Ok(())
    }

    fn refuse(&mut self, bound: MemoryBound, what: &str) -> wasmtime::Error {
        self.hit = Some(bound);
        match bound {
            MemoryBound::Call => wasmtime::format_err!(
                "memory budget of {} bytes per call reached ({what}; {} held)",
                self.limit,
                self.held
            ),
            MemoryBound::Total => wasmtime::format_err!(
                "the plugins' memory total of {} bytes is held by calls in flight ({what})",
                self.total.ceiling
            ),
        }
    }
}

impl Drop for MemoryLimiter {
    fn drop(&mut self) {
        self.total.give_back(self.held);
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        match self.grow(desired.saturating_sub(current)) {
            Ok(()) => Ok(true),
            // An error (rather than `Ok(false)`) traps at once instead of letting the guest's
            // allocator spin on failed grows.
            Err(bound) => Err(self.refuse(bound, &format!("a memory wants {desired} bytes"))),
        }
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        let extra = desired.saturating_sub(current) * TABLE_ELEMENT_BYTES;
        match self.grow(extra) {
            Ok(()) => Ok(true),
            Err(bound) => Err(self.refuse(bound, &format!("a table wants {desired} elements"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// A core module with `count` memories of `mib` MiB each (multi-memory).
    fn module_with_memories(
        engine: &wasmtime::Engine,
        count: usize,
        mib: usize,
    ) -> wasmtime::Module {
        let pages = mib * MIB / 65536;
        let memories = format!("(memory {pages})\n").repeat(count);
        let wat = format!("(module {memories})");
        wasmtime::Module::new(engine, wat::parse_str(&wat).unwrap()).unwrap()
    }

    fn instantiate(
        engine: &wasmtime::Engine,
        module: &wasmtime::Module,
        limit: usize,
        total: &Arc<MemoryTotal>,
    ) -> (
        wasmtime::Store<MemoryLimiter>,
        Result<(), Option<MemoryBound>>,
    ) {
        let mut store = wasmtime::Store::new(engine, MemoryLimiter::new(limit, total.clone()));
        store.limiter(|l| l);
        let result = wasmtime::Instance::new(&mut store, module, &[])
            .map(drop)
            .map_err(|_| store.data().hit);
        (store, result)
    }

    #[test]
    fn four_memories_of_120_mib_do_not_fit_a_128_mib_budget() {
        let engine = wasmtime::Engine::default();
        let total = MemoryTotal::new(1024 * MIB);
        let four = module_with_memories(&engine, 4, 120);
        let (failed, result) = instantiate(&engine, &four, 128 * MIB, &total);
        assert_eq!(result, Err(Some(MemoryBound::Call)));
        drop(failed);
        assert_eq!(
            total.held(),
            0,
            "the refused call's first memory is given back"
        );
        // One of them fits, and its bytes are held in the total until the store goes.
        let one = module_with_memories(&engine, 1, 120);
        let (store, result) = instantiate(&engine, &one, 128 * MIB, &total);
        assert_eq!(result, Ok(()));
        assert_eq!(total.held(), 120 * MIB);
        drop(store);
        assert_eq!(total.held(), 0, "given back with the store");
    }

    #[test]
    fn calls_in_flight_share_the_total() {
        let engine = wasmtime::Engine::default();
        let total = MemoryTotal::new(200 * MIB);
        let module = module_with_memories(&engine, 1, 100);
        let (first, result) = instantiate(&engine, &module, 128 * MIB, &total);
        assert_eq!(result, Ok(()));
        let (second, result) = instantiate(&engine, &module, 128 * MIB, &total);
        assert_eq!(result, Ok(()));
        let (_third, result) = instantiate(&engine, &module, 128 * MIB, &total);
        assert_eq!(result, Err(Some(MemoryBound::Total)), "the total is full");
        assert_eq!(total.held(), 200 * MIB, "the refused call took nothing");
        drop((first, second));
        let (_fourth, result) = instantiate(&engine, &module, 128 * MIB, &total);
        assert_eq!(result, Ok(()), "room again once calls end");
    }

    #[test]
    fn tables_count_against_the_budget() {
        let engine = wasmtime::Engine::default();
        let total = MemoryTotal::new(1024 * MIB);
        // 100 000 elements × 8 bytes = 800 000 bytes, over a 512 KiB budget.
        let wat = "(module (table 100000 funcref))";
        let module = wasmtime::Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
        let (_store, result) = instantiate(&engine, &module, 512 << 10, &total);
        assert_eq!(result, Err(Some(MemoryBound::Call)));
        let (_store, result) = instantiate(&engine, &module, MIB, &total);
        assert_eq!(result, Ok(()));
    }
}
