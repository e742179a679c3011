//! Pure pieces of the shared-memory ledger (`pg_ext/ctxguard/src/ledger/`): UTC days, 128-bit
//! keys, coverage bitmaps, fixed-size slot tables with eviction, and the audit hash chain.
//!
//! Everything here is `Copy` and heap-free so that it can live in PostgreSQL shared memory, where
//! an all-zero value is the valid empty state (the extension zero-fills the segment).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Seconds in a day.
const DAY: i64 = 86_400;

/// The UTC day number (days since 1970-01-01) of a Unix time in seconds. Whatever the session's
/// `TimeZone`: the ledger never asks the session what day it is.
pub fn utc_day(unix_secs: i64) -> i32 {
    i32::try_from(unix_secs.div_euclid(DAY)).unwrap_or(i32::MAX)
}

/// PostgreSQL's `date` for a UTC day number (PostgreSQL dates count from 2000-01-01).
pub fn pg_date(day: i32) -> i32 {
    day - 10_957
}

/// A ledger key: the first 128 bits of SHA-256 over the length-prefixed parts. Never zero (zero
/// marks a free slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Key(pub [u8; 16]);

impl Key {
    pub fn of(parts: &[&[u8]]) -> Key {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        let d = h.finalize();
        let mut k = [0u8; 16];
        k.copy_from_slice(&d[..16]);
        if k == [0u8; 16] {
            k[0] = 1;
        }
        Key(k)
    }

    pub fn is_free(&self) -> bool {
        self.0 == [0u8; 16]
    }

    /// The two candidate buckets (`which` 0 or 1) in a table of `buckets` buckets: each half of
    /// the key picks one.
    fn bucket(&self, buckets: usize, which: usize) -> usize {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8 * which..8 * which + 8]);
        (u64::from_le_bytes(b) % buckets as u64) as usize
    }
}

/// Pages tracked one by one per coverage entry; pages past this are counted conservatively.
pub const COVERAGE_BITS: usize = 1024;

/// The pages one user read of one document on one UTC day. Pages `1..=COVERAGE_BITS` are a
/// bitmap; a page beyond it counts as new every time it is read (never under-counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    bits: [u64; COVERAGE_BITS / 64],
    overflow: u32,
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage {
            bits: [0; COVERAGE_BITS / 64],
            overflow: 0,
        }
    }
}

impl Coverage {
    fn bit(page: i32) -> Option<(usize, u64)> {
        let p = usize::try_from(page).ok()?.checked_sub(1)?;
        (p < COVERAGE_BITS).then(|| (p / 64, 1u64 << (p % 64)))
    }

    /// Pages counted so far.
    pub fn count(&self) -> i64 {
        self.bits
            .iter()
            .map(|w| i64::from(w.count_ones()))
            .sum::<i64>()
            + i64::from(self.overflow)
    }

    /// How many of `pages` would be new (duplicates within `pages` counted once).
    pub fn fresh(&self, pages: &[i32]) -> i64 {
        let mut probe = *self;
        probe.add(pages)
    }

    /// Mark `pages` read; returns how many were new.
    pub fn add(&mut self, pages: &[i32]) -> i64 {
        let before = self.count();
        for &p in pages {
            match Coverage::bit(p) {
                Some((w, m)) => self.bits[w] |= m,
                None => self.overflow = self.overflow.saturating_add(1),
            }
        }
        self.count() - before
    }

    /// Read `pages` only if the count stays within `allowed`: `Ok(count after)` or
    /// `Err(count before)`. Atomic with respect to the entry (the caller holds the lock).
    pub fn take(&mut self, pages: &[i32], allowed: i64) -> Result<i64, i64> {
        let before = self.count();
        if before + self.fresh(pages) > allowed {
            return Err(before);
        }
        self.add(pages);
        Ok(self.count())
    }

    pub fn pages(&self) -> impl Iterator<Item = i32> + '_ {
        (0..COVERAGE_BITS)
            .filter(|i| self.bits[i / 64] & (1u64 << (i % 64)) != 0)
            .map(|i| i as i32 + 1)
    }
}

/// One slot: a key, when it stops mattering (Unix seconds; 0 = free), its value, and whose it is
/// (the [`Owner`] of tenant and user; zero for the share table's own entries).
#[derive(Debug, Clone, Copy, Default)]
pub struct Slot<V: Copy> {
    pub key: Key,
    pub expires: i64,
    pub owner: Owner,
    pub value: V,
}

impl<V: Copy> Slot<V> {
    fn free(&mut self) {
        self.key = Key::default();
        self.expires = 0;
        self.owner = Owner::default();
    }
}

/// Whose entry a slot holds: 64-bit hashes of the tenant and of (tenant, user). Zero: nobody's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    pub tenant: u64,
    pub user: u64,
}

impl Owner {
    pub fn of(tenant: &str, user: &str) -> Owner {
        let h = |k: Key| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&k.0[..8]);
            u64::from_le_bytes(b).max(1)
        };
        Owner {
            tenant: h(Key::of(&[b"tenant", tenant.as_bytes()])),
            user: h(Key::of(&[b"user", tenant.as_bytes(), user.as_bytes()])),
        }
    }

    fn is_none(&self) -> bool {
        self.tenant == 0
    }

    fn tenant_key(&self) -> Key {
        Key::of(&[b"t", &self.tenant.to_le_bytes()])
    }

    fn user_key(&self) -> Key {
        Key::of(&[b"u", &self.tenant.to_le_bytes(), &self.user.to_le_bytes()])
    }
}

/// Slots per bucket: a key lives in one bucket, found by scanning it whole (no tombstones).
pub const BUCKET: usize = 16;

/// The table is full where this key must go (every slot of its bucket is live): fail closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// A hash table with expiry over a fixed array of slots (in shared memory: sized once, at server
/// start). The number of slots is a multiple of [`BUCKET`]; a key lives in one bucket.
#[derive(Debug)]
pub struct Table<'a, V: Copy> {
    slots: &'a mut [Slot<V>],
}

/// Slots for `wanted` entries: rounded up to whole buckets (at least one).
pub fn table_slots(wanted: usize) -> usize {
    wanted.max(1).div_ceil(BUCKET) * BUCKET
}

impl<'a, V: Copy> Table<'a, V> {
    /// The table over `slots` (all-zero slots are free). Panics unless its length is a positive
    /// multiple of [`BUCKET`].
    pub fn new(slots: &'a mut [Slot<V>]) -> Self {
        assert!(
            !slots.is_empty() && slots.len().is_multiple_of(BUCKET),
            "a ledger table needs whole buckets"
        );
        Table { slots }
    }

    /// The slots of the key's two candidate buckets (the same bucket twice in a one-bucket table).
    fn candidates(&self, key: &Key) -> [std::ops::Range<usize>; 2] {
        let n = self.slots.len() / BUCKET;
        [0, 1].map(|w| {
            let b = key.bucket(n, w);
            b * BUCKET..(b + 1) * BUCKET
        })
    }

    fn find_live(&self, key: &Key, now: i64) -> Option<usize> {
        self.candidates(key)
            .into_iter()
            .flatten()
            .find(|&i| self.slots[i].key == *key && self.slots[i].expires > now)
    }

    /// The live entry for `key` at time `now`.
    pub fn get(&mut self, key: &Key, now: i64) -> Option<&mut V> {
        let i = self.find_live(key, now)?;
        Some(&mut self.slots[i].value)
    }

    /// Insert `key` with `value` (or keep the live entry), into the emptier of its two buckets
    /// ("two choices": buckets stay even, so a table fills almost completely before any insert
    /// fails), evicting an expired slot if needed. Returns the entry.
    pub fn insert(&mut self, key: &Key, expires: i64, value: V, now: i64) -> Result<&mut V, Full> {
        let (i, _) = self.insert_owned(key, expires, value, now, Owner::default())?;
        Ok(&mut self.slots[i].value)
    }

    /// [`Table::insert`] for `owner`: the slot's index and, when the insert evicted an expired
    /// entry that had an owner, that owner (whose share the caller gives back).
    fn insert_owned(
        &mut self,
        key: &Key,
        expires: i64,
        value: V,
        now: i64,
        owner: Owner,
    ) -> Result<(usize, Option<Owner>), Full> {
        if let Some(i) = self.find_live(key, now) {
            return Ok((i, None));
        }
        let open = |s: &Slot<V>| s.expires <= now || s.key.is_free();
        let [a, b] = self.candidates(key);
        let free = |r: &std::ops::Range<usize>| r.clone().filter(|&i| open(&self.slots[i])).count();
        let best = if free(&b) > free(&a) { b } else { a };
        let i = best.clone().find(|&i| open(&self.slots[i])).ok_or(Full)?;
        let old = self.slots[i];
        let evicted = (!old.key.is_free() && !old.owner.is_none()).then_some(old.owner);
        self.slots[i] = Slot {
            key: *key,
            expires,
            owner,
            value,
        };
        Ok((i, evicted))
    }

    /// Free the slot of `key` (live or not).
    fn remove(&mut self, key: &Key) {
        for i in self.candidates(key).into_iter().flatten() {
            if self.slots[i].key == *key {
                self.slots[i].free();
            }
        }
    }

    /// Free every expired slot; `gone` is told the owner of each that had one.
    fn sweep(&mut self, now: i64, mut gone: impl FnMut(Owner)) {
        for s in self.slots.iter_mut() {
            if !s.key.is_free() && s.expires <= now {
                if !s.owner.is_none() {
                    gone(s.owner);
                }
                s.free();
            }
        }
    }

    /// Live entries at `now`.
    pub fn live(&self, now: i64) -> usize {
        self.slots
            .iter()
            .filter(|s| !s.key.is_free() && s.expires > now)
            .count()
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

/// Live entries one owner holds in each ledger table (by [`Share::table`] index), and for a
/// tenant's entry, how many of its users hold entries. One table of these (the share table)
/// counts every tenant and every user with live entries, so that one of them filling its share
/// is refused while everyone else keeps theirs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub entries: [u32; TABLES],
    pub users: u32,
    /// The tenant's id (for `ledger_stats`), cut at [`TENANT_NAME`] bytes; users leave it empty.
    pub name_len: u8,
    pub name: [u8; TENANT_NAME],
}

/// The ledger's tables that are shared out: generations, document calls, coverage, user days,
/// call quotas.
pub const TABLES: usize = 5;
/// Bytes of a tenant's id kept for `ledger_stats`.
pub const TENANT_NAME: usize = 32;

impl Held {
    pub fn name(&self) -> String {
        String::from_utf8_lossy(&self.name[..usize::from(self.name_len).min(TENANT_NAME)])
            .into_owned()
    }

    fn is_empty(&self) -> bool {
        self.entries.iter().all(|&n| n == 0) && self.users == 0
    }
}

/// How much of one table a tenant and a user may hold, and of the share table how many users
/// one tenant may have counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub table: usize,
    pub tenant: u32,
    pub user: u32,
    pub tenant_users: u32,
}

impl Share {
    /// The caps for a table of `slots` slots and a share table of `owner_slots`: `tenant_pct`
    /// and `user_pct` percent of the table (at least one entry each), `tenant_pct` percent of
    /// the share table's slots for one tenant's users.
    pub fn of(
        table: usize,
        slots: usize,
        owner_slots: usize,
        tenant_pct: u32,
        user_pct: u32,
    ) -> Share {
        let pct = |n: usize, p: u32| {
            u32::try_from((n as u64 * u64::from(p.min(100))).div_ceil(100))
                .unwrap_or(u32::MAX)
                .max(1)
        };
        Share {
            table,
            tenant: pct(slots, tenant_pct),
            user: pct(slots, user_pct).min(pct(slots, tenant_pct)),
            tenant_users: pct(owner_slots, tenant_pct),
        }
    }
}

/// Why an owned insert was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The tenant holds its share of the table.
    Tenant,
    /// The user holds their share of the table.
    User,
    /// The tenant has its share of the share table's user entries, or the share table is full.
    Owners,
    /// The table itself is full where the key must go.
    Full,
}

/// Insert `key` into `table` for `owner` within `share`, counting it in `owners` (the share
/// table). A live key is returned as it is (counted already). An expired entry the insert
/// evicts gives its owner's count back. `tenant` names the tenant's share entry (for stats).
#[allow(clippy::too_many_arguments)]
pub fn insert_shared<'t, V: Copy>(
    table: &'t mut Table<'_, V>,
    owners: &mut Table<'_, Held>,
    share: Share,
    owner: Owner,
    tenant: &str,
    key: &Key,
    expires: i64,
    value: V,
    now: i64,
) -> Result<&'t mut V, Refused> {
    if let Some(i) = table.find_live(key, now) {
        return Ok(&mut table.slots[i].value);
    }
    let (tk, uk) = (owner.tenant_key(), owner.user_key());
    let held_t = owners.get(&tk, now).copied().unwrap_or_default();
    let held_u = owners.get(&uk, now).copied();
    if held_t.entries[share.table] >= share.tenant {
        return Err(Refused::Tenant);
    }
    if held_u.is_some_and(|h| h.entries[share.table] >= share.user) {
        return Err(Refused::User);
    }
    if held_u.is_none() && held_t.users >= share.tenant_users {
        return Err(Refused::Owners);
    }
    // Room in the share table for both entries, before anything changes.
    let t_new = owners.find_live(&tk, now).is_none();
    let u_new = held_u.is_none();
    if t_new || u_new {
        let mut probe_t = None;
        if t_new {
            match owners.insert(&tk, i64::MAX, Held::default(), now) {
                Ok(h) => {
                    let n = tenant.len().min(TENANT_NAME);
                    h.name[..n].copy_from_slice(&tenant.as_bytes()[..n]);
                    h.name_len = n as u8;
                    probe_t = Some(());
                }
                Err(Full) => return Err(Refused::Owners),
            }
        }
        if u_new && owners.insert(&uk, i64::MAX, Held::default(), now).is_err() {
            if probe_t.is_some() {
                owners.remove(&tk);
            }
            return Err(Refused::Owners);
        }
        if u_new {
            owners.get(&tk, now).expect("inserted").users += 1;
        }
    }
    let (i, evicted) = match table.insert_owned(key, expires, value, now, owner) {
        Ok(r) => r,
        Err(Full) => {
            // Give back what this insert took in the share table.
            release(owners, owner, None, now);
            return Err(Refused::Full);
        }
    };
    owners.get(&tk, now).expect("present").entries[share.table] += 1;
    owners.get(&uk, now).expect("present").entries[share.table] += 1;
    if let Some(o) = evicted {
        release(owners, o, Some(share.table), now);
    }
    Ok(&mut table.slots[i].value)
}

/// `owner` holds one entry fewer of table `which` (if any); entries of the share table that count
/// nothing any more are freed.
fn release(owners: &mut Table<'_, Held>, owner: Owner, which: Option<usize>, now: i64) {
    let (tk, uk) = (owner.tenant_key(), owner.user_key());
    let mut user_gone = false;
    if let Some(u) = owners.get(&uk, now) {
        if let Some(w) = which {
            u.entries[w] = u.entries[w].saturating_sub(1);
        }
        if u.is_empty() {
            owners.remove(&uk);
            user_gone = true;
        }
    }
    if let Some(t) = owners.get(&tk, now) {
        if let Some(w) = which {
            t.entries[w] = t.entries[w].saturating_sub(1);
        }
        if user_gone {
            t.users = t.users.saturating_sub(1);
        }
        if t.is_empty() {
            owners.remove(&tk);
        }
    }
}

/// Free the expired entries of `table` (table `which` of the shares), giving their owners' shares
/// back. O(slots): the caller runs it only when a share or the table is full, and not more than
/// once a second per table.
pub fn sweep_shared<V: Copy>(
    table: &mut Table<'_, V>,
    owners: &mut Table<'_, Held>,
    which: usize,
    now: i64,
) {
    table.sweep(now, |o| release(owners, o, Some(which), now));
}

/// The tenants' entries of the share table: (tenant, entries per table, users).
pub fn tenants_held(owners: &Table<'_, Held>, now: i64) -> Vec<(String, [u32; TABLES], u32)> {
    owners
        .slots
        .iter()
        .filter(|s| !s.key.is_free() && s.expires > now && s.value.name_len > 0)
        .map(|s| (s.value.name(), s.value.entries, s.value.users))
        .collect()
}

/// End (Unix seconds, exclusive) of a UTC day: day-keyed entries expire then.
pub fn day_end(day: i32) -> i64 {
    (i64::from(day) + 1) * DAY
}

/// The audit chain: each row's hash covers its content and the previous row's hash (per tenant).
/// `fields` are the row's columns as text (None for NULL), in a fixed order.
pub fn chain_hash(prev: &str, fields: &[Option<&str>]) -> String {
    let mut h = Sha256::new();
    h.update(b"ctxguard-audit-v1\0");
    h.update((prev.len() as u64).to_le_bytes());
    h.update(prev.as_bytes());
    for f in fields {
        match f {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
        }
    }
    crate::hex(&h.finalize())
}

/// PostgreSQL's text form of a `jsonb` value (what `jsonb_out` prints for the value `jsonb_in`
/// makes of `v`'s JSON text): `", "` and `": "` between items, object keys shortest first and then
/// by their bytes, numbers as `numeric` prints them (no exponent), strings escaped as
/// `escape_json` does. The audit chain hashes rows in this form, so that the writer (here) and
/// `ctxguard.verify_audit` (in SQL, `jsonb_build_array(...)::text`) agree byte for byte.
pub fn jsonb_text(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&numeric_text(&n.to_string())),
        Value::String(s) => json_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                jsonb_text(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| {
                a.len()
                    .cmp(&b.len())
                    .then_with(|| a.as_bytes().cmp(b.as_bytes()))
            });
            out.push('{');
            for (k, key) in keys.into_iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                json_string(key, out);
                out.push_str(": ");
                jsonb_text(&map[key], out);
            }
            out.push('}');
        }
    }
}

/// A JSON string as PostgreSQL's `escape_json` writes it.
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON number's text as `numeric` prints it: `numeric_in` keeps the digits after the point
/// (less the exponent) as the scale, and `numeric_out` writes no exponent and no negative zero.
fn numeric_text(t: &str) -> String {
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(k) => (&t[..k], t[k + 1..].parse::<i64>().unwrap_or(0)),
        None => (t, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = format!("{int}{frac}");
    // Where the point falls in `digits`, counted from the left.
    let point = int.len() as i64 + exp;
    let n = digits.len() as i64;
    let int_part: String = if point <= 0 {
        String::new()
    } else if point >= n {
        format!("{digits}{}", "0".repeat((point - n) as usize))
    } else {
        digits[..point as usize].to_string()
    };
    let int_part = int_part.trim_start_matches('0');
    let frac_part: String = if point >= n {
        String::new()
    } else if point < 0 {
        format!("{}{digits}", "0".repeat((-point) as usize))
    } else {
        digits[point as usize..].to_string()
    };
    let mut out = String::new();
    if neg && digits.bytes().any(|b| b != b'0') {
        out.push('-');
    }
    out.push_str(if int_part.is_empty() { "0" } else { int_part });
    if !frac_part.is_empty() {
        out.push('.');
        out.push_str(&frac_part);
    }
    out
}

/// Append a row of `tenant` whose canonical text is `canon` to its chain: the row's
/// `(prev_hash, row_hash)`, and `heads[tenant]` becomes the row's hash. `None` if `heads` has no
/// entry for `tenant`: the caller says where every chain starts (`""` for a tenant with no rows),
/// so that a forgotten head breaks nothing silently.
pub fn link<K: Eq + Hash>(
    heads: &mut HashMap<K, String>,
    tenant: &K,
    canon: &str,
) -> Option<(String, String)> {
    let head = heads.get_mut(tenant)?;
    let hash = chain_hash(head, &[Some(canon)]);
    let prev = std::mem::replace(head, hash.clone());
    Some((prev, hash))
}

/// A chain checked one row at a time, in order, in memory that does not grow with it: each row's
/// stored hash must be the hash of its content and of its predecessor's stored hash.
/// `ctxguard.verify_audit` feeds it a tenant's rows as it reads them.
#[derive(Debug, Default)]
pub struct ChainCheck {
    expected_prev: String,
    rows: u64,
    broken: Option<u64>,
}

impl ChainCheck {
    /// The next row of the chain: `true` while the chain holds up to and including it. Rows after
    /// the first broken one are counted, not hashed.
    pub fn push(&mut self, prev: &str, hash: &str, fields: &[Option<&str>]) -> bool {
        let i = self.rows;
        self.rows += 1;
        if self.broken.is_some() {
            return false;
        }
        if prev != self.expected_prev || chain_hash(prev, fields) != hash {
            self.broken = Some(i);
            return false;
        }
        self.expected_prev.clear();
        self.expected_prev.push_str(hash);
        true
    }

    /// Rows pushed.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The index of the first broken row, if any.
    pub fn first_broken(&self) -> Option<u64> {
        self.broken
    }
}

/// When the writer writes again the generation counters still waiting for their generation's row
/// (minted in a transaction that was still open when its calls were charged): [`Retry::FIRST`]
/// after the last try, twice as long each time nothing was saved, up to [`Retry::MAX`], and back
/// to the first interval whenever new counters start waiting. Due whether or not batches keep
/// coming: under constant load the queue is never empty, and counters that waited only for an
/// idle moment would wait, unsaved, as long as the load lasts.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    last: std::time::Instant,
    every: std::time::Duration,
}

impl Retry {
    pub const FIRST: std::time::Duration = std::time::Duration::from_millis(100);
    pub const MAX: std::time::Duration = std::time::Duration::from_secs(10);

    pub fn new(now: std::time::Instant) -> Retry {
        Retry {
            last: now,
            every: Retry::FIRST,
        }
    }

    /// Is a retry due at `now`?
    pub fn due(&self, now: std::time::Instant) -> bool {
        self.until_due(now).is_zero()
    }

    /// How long until the next retry is due (zero: now).
    pub fn until_due(&self, now: std::time::Instant) -> std::time::Duration {
        self.every
            .saturating_sub(now.saturating_duration_since(self.last))
    }

    /// A retry ran at `now`; `saved_any`: it wrote some of the waiting counters.
    pub fn tried(&mut self, now: std::time::Instant, saved_any: bool) {
        self.last = now;
        self.every = if saved_any {
            Retry::FIRST
        } else {
            (self.every * 2).min(Retry::MAX)
        };
    }

    /// New counters started waiting: retry them soon.
    pub fn waiting_again(&mut self) {
        self.every = Retry::FIRST;
    }
}

/// A quota: (tenant, user or "" for the tenant's count, tool, window).
pub type QuotaKey = (String, String, String, String);
/// A user's UTC day: (tenant, user, day as days since 2000-01-01).
pub type DayKey = (String, String, i64);
/// Each counter of a batch with its state once the batch commits ([`Margins::committed`]).
pub type Seen<K = QuotaKey> = Vec<(K, Margin)>;

/// What a counter's row holds against what was counted, for the counters this writer persisted
/// ahead of their calls: a quota window's calls, or a user's bytes of a day (`start`: the window's
/// start, or the day; a later one replaces the counter).
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Margin {
    pub start: i64,
    pub persisted: i64,
    pub counted: i64,
}

/// The counters this writer persisted, by key, each with when a call last moved it (this writer's
/// memory: the counters of the last [`MARGIN_QUIET`] or so), and how far ahead one may be for its
/// limit ([`margin`] for quotas, [`byte_margin`] for days).
pub struct Margins<K = QuotaKey> {
    by_key: HashMap<K, (Margin, Instant)>,
    /// When to look again for quiet counters (none: nothing is kept).
    next_sweep: Option<Instant>,
    margin: fn(i64) -> i64,
}

impl Default for Margins<QuotaKey> {
    fn default() -> Self {
        Margins::new(margin)
    }
}

/// How far ahead of a window's calls its persisted count may be for a quota of `limit` calls: a
/// sixty-fourth of the limit, at most 64 (none below 64 calls). The writer then writes a busy
/// window's row once every so many calls instead of with every call's audit row; the exact count
/// follows once the window has had no call for [`MARGIN_QUIET`] (and when the writer stops). What
/// is persisted is never below
/// the calls audited, so after a crash (when the ledger reloads the row) a window counts at most
/// this many calls more than were made: it refuses early, never late.
pub fn margin(limit: i64) -> i64 {
    (limit / 64).clamp(0, 64)
}

/// How far ahead of a user's bytes of a day the persisted bytes may be for a daily limit of
/// `limit` bytes: a sixty-fourth of the limit, at most 1 MiB (the default limit's sixty-fourth).
/// As with [`margin`], a crash then counts at most this many bytes more than were received.
pub fn byte_margin(limit: i64) -> i64 {
    (limit / 64).clamp(0, 1 << 20)
}

/// How long a counter persisted ahead of its calls must have had no call before its exact count is
/// written (and it is forgotten: its next call is written as counted again). Counting from the last
/// call, not the first one ahead: a user who calls every few hundred milliseconds costs one row
/// write every so many calls, not an ahead write and an exact write with every call (issue 34:
/// with 100 ms from the first, a document reader calling every 250 ms paid both, every call).
pub const MARGIN_QUIET: Duration = Duration::from_secs(1);

/// How often the writer looks for quiet counters.
pub const MARGIN_SWEEP: Duration = Duration::from_millis(250);

impl<K: std::hash::Hash + Eq + Clone> Margins<K> {
    pub fn new(margin: fn(i64) -> i64) -> Margins<K> {
        Margins {
            by_key: HashMap::new(),
            next_sweep: None,
            margin,
        }
    }

    /// Which of `counters` (each one's latest value `n` in a batch, with its window or day `start`
    /// and its limit) to write, and with what value: a counter new to this writer (or in a new
    /// window or day) is written `n` as it is; a counter called again since, whose count reached
    /// what was persisted, is written `n` plus its margin (never past the limit, unless `n` is);
    /// the others not at all. So a counter called once in a while costs one exact write per call
    /// and nothing after, and one that keeps being called costs a write every so many calls and
    /// its exact count once it is quiet. Also returned: each counter's state once the batch
    /// commits ([`Margins::committed`]).
    pub fn plan(&self, counters: HashMap<K, (i64, i64, i64)>) -> (HashMap<K, (i64, i64)>, Seen<K>) {
        let mut write = HashMap::new();
        let mut seen = Vec::with_capacity(counters.len());
        for (k, (start, n, limit)) in counters {
            // What this writer knows of the counter in this window or day.
            let known = self
                .by_key
                .get(&k)
                .map(|(m, _)| m)
                .filter(|m| m.start == start);
            let m = match known {
                Some(m) if n <= m.persisted => Margin {
                    counted: n.max(m.counted),
                    ..*m
                },
                _ => {
                    let persisted = match known {
                        Some(_) => n.saturating_add((self.margin)(limit)).min(n.max(limit)),
                        None => n,
                    };
                    write.insert(k.clone(), (start, persisted));
                    Margin {
                        start,
                        persisted,
                        counted: n,
                    }
                }
            };
            seen.push((k, m));
        }
        (write, seen)
    }

    /// Record what a committed transaction wrote at `now` (`plan`'s second part, possibly several
    /// times over for one counter when a batch was written record by record): each counter's
    /// state, and that a call moved it now.
    pub fn committed(&mut self, seen: Seen<K>, now: Instant) {
        for (k, m) in seen {
            let e = self.by_key.entry(k).or_insert((m, now));
            e.1 = now;
            let e = &mut e.0;
            if m.start > e.start {
                *e = m;
            } else if m.start == e.start {
                e.persisted = e.persisted.max(m.persisted);
                e.counted = e.counted.max(m.counted);
            }
        }
        if self.next_sweep.is_none() && !self.by_key.is_empty() {
            self.next_sweep = Some(now + MARGIN_SWEEP);
        }
    }

    /// Is the counter's last call at least [`MARGIN_QUIET`] before `now` (every counter when
    /// `force`d)?
    fn quiet(last: Instant, now: Instant, force: bool) -> bool {
        force || now.saturating_duration_since(last) >= MARGIN_QUIET
    }

    /// The quiet counters (every counter when `force`d) whose persisted value is ahead of their
    /// count: the exact writes due.
    pub fn ahead(&self, now: Instant, force: bool) -> Vec<(K, Margin)> {
        self.by_key
            .iter()
            .filter(|(_, (m, last))| {
                m.persisted > m.counted && Margins::<K>::quiet(*last, now, force)
            })
            .map(|(k, (m, _))| (k.clone(), *m))
            .collect()
    }

    /// Is it time to look for quiet counters (every [`MARGIN_SWEEP`] while any is kept; at once
    /// when `force`d and any is kept)?
    pub fn due(&self, now: Instant, force: bool) -> bool {
        !self.by_key.is_empty() && (force || self.next_sweep.is_some_and(|t| now >= t))
    }

    /// After the exact values of [`Margins::ahead`]`(now, force)` were written (or could not be:
    /// the rows then stay ahead): the quiet counters (every counter when `force`d) are forgotten,
    /// ahead or not (the next call of each is written as counted again); the others are kept as
    /// they are.
    pub fn flushed(&mut self, now: Instant, force: bool) {
        self.by_key
            .retain(|_, (_, last)| !Margins::<K>::quiet(*last, now, force));
        self.next_sweep = (!self.by_key.is_empty()).then(|| now + MARGIN_SWEEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first row of a chain whose stored hash is not the hash of its content and its
    /// predecessor's stored hash: `Some(index)`, or `None` if the chain holds ([`ChainCheck`]
    /// over a list).
    fn first_broken<'a>(
        rows: impl IntoIterator<Item = (&'a str, &'a str, Vec<Option<&'a str>>)>,
    ) -> Option<usize> {
        let mut check = ChainCheck::default();
        for (prev, hash, fields) in rows {
            if !check.push(prev, hash, &fields) {
                break;
            }
        }
        check.first_broken().map(|i| i as usize)
    }

    fn quota(n: i64, limit: i64) -> HashMap<QuotaKey, (i64, i64, i64)> {
        let k = ("t".into(), "u".into(), "tool".into(), "1h".into());
        HashMap::from([(k, (3600, n, limit))])
    }

    /// The (window start, count) writes of a plan.
    fn writes(write: &HashMap<QuotaKey, (i64, i64)>) -> Vec<(i64, i64)> {
        write.values().copied().collect()
    }

    #[test]
    fn quota_windows_are_persisted_ahead_by_a_bounded_margin() {
        assert_eq!(
            (
                margin(0),
                margin(63),
                margin(64),
                margin(640),
                margin(1_000_000)
            ),
            (0, 0, 1, 10, 64)
        );
        let t = Instant::now();
        let mut m = Margins::default();
        // A small quota: every count is written as it is, and nothing is left to write exactly.
        for n in 1..=3 {
            let (write, seen) = m.plan(quota(n, 20));
            assert_eq!(writes(&write), [(3600, n)]);
            m.committed(seen, t);
        }
        assert!(m.ahead(t + MARGIN_QUIET, true).is_empty());
        let mut m = Margins::default();
        // A large one: its first count (new to the writer) as it is; called again, written ahead
        // by its margin, then not again until the calls reach it.
        let (write, seen) = m.plan(quota(1, 6400));
        assert_eq!(writes(&write), [(3600, 1)]);
        m.committed(seen, t);
        assert!(m.ahead(t, true).is_empty(), "nothing to bring down");
        let (write, seen) = m.plan(quota(2, 6400));
        assert_eq!(writes(&write), [(3600, 66)]);
        // Not committed yet: the same count plans the same write again.
        assert_eq!(m.plan(quota(2, 6400)).0.len(), 1);
        m.committed(seen, t);
        for n in 3..=66 {
            let (write, seen) = m.plan(quota(n, 6400));
            assert!(write.is_empty(), "count {n} is covered by the 66 persisted");
            m.committed(seen, t);
        }
        let (write, seen) = m.plan(quota(67, 6400));
        assert_eq!(writes(&write), [(3600, 131)]);
        m.committed(seen, t);
        // What is persisted is never below the calls, and ahead by at most the margin.
        let ahead = m.ahead(t, true);
        assert_eq!(ahead.len(), 1);
        assert_eq!((ahead[0].1.persisted, ahead[0].1.counted), (131, 67));
        // Near the limit the margin stops at the limit; past it (shadow mode counts on) the count.
        let mut near = Margins::default();
        near.committed(near.plan(quota(6380, 6400)).1, t);
        assert_eq!(writes(&near.plan(quota(6390, 6400)).0), [(3600, 6400)]);
        near.committed(near.plan(quota(6390, 6400)).1, t);
        assert_eq!(writes(&near.plan(quota(6401, 6400)).0), [(3600, 6401)]);
        // A new window is written at once, as it is.
        let k = ("t".into(), "u".into(), "tool".into(), "1h".into());
        let (write, _) = m.plan(HashMap::from([(k, (7200, 1, 6400))]));
        assert_eq!(writes(&write), [(7200, 1)]);
    }

    #[test]
    fn a_users_day_bytes_are_persisted_ahead_by_at_most_a_mebibyte() {
        const MIB: i64 = 1 << 20;
        assert_eq!(
            (
                byte_margin(0),
                byte_margin(63),
                byte_margin(6400),
                byte_margin(64 * MIB),
                byte_margin(i64::from(i32::MAX))
            ),
            (0, 0, 100, MIB, MIB)
        );
        let t = Instant::now();
        let day = |n: i64, limit: i64| -> HashMap<DayKey, (i64, i64, i64)> {
            HashMap::from([(("t".into(), "u".into(), 9_000), (9_000, n, limit))])
        };
        let mut m: Margins<DayKey> = Margins::new(byte_margin);
        // Under the default limit (64 MiB): the first result's bytes as they are; the next ones
        // plus 1 MiB, then nothing until the bytes reach what was persisted.
        let (write, seen) = m.plan(day(409, 64 * MIB));
        assert_eq!(write.values().copied().collect::<Vec<_>>(), [(9_000, 409)]);
        m.committed(seen, t);
        let (write, seen) = m.plan(day(818, 64 * MIB));
        assert_eq!(
            write.values().copied().collect::<Vec<_>>(),
            [(9_000, 818 + MIB)]
        );
        m.committed(seen, t);
        for n in [1227, 100_000, 818 + MIB] {
            let (write, seen) = m.plan(day(n, 64 * MIB));
            assert!(write.is_empty(), "{n} bytes are covered");
            m.committed(seen, t);
        }
        let (write, seen) = m.plan(day(819 + MIB, 64 * MIB));
        assert_eq!(
            write.values().copied().collect::<Vec<_>>(),
            [(9_000, 819 + 2 * MIB)]
        );
        m.committed(seen, t);
        let ahead = m.ahead(t + MARGIN_QUIET, false);
        assert_eq!(
            (ahead[0].1.persisted, ahead[0].1.counted),
            (819 + 2 * MIB, 819 + MIB)
        );
        assert!(m.due(t + MARGIN_QUIET, false), "the exact bytes follow");
        // Never past the limit: a small limit's margin stops there.
        let mut small: Margins<DayKey> = Margins::new(byte_margin);
        small.committed(small.plan(day(5900, 6400)).1, t);
        assert_eq!(
            small
                .plan(day(6000, 6400))
                .0
                .values()
                .copied()
                .collect::<Vec<_>>(),
            [(9_000, 6100)]
        );
        small.committed(small.plan(day(6000, 6400)).1, t);
        assert_eq!(
            small
                .plan(day(6350, 6400))
                .0
                .values()
                .copied()
                .collect::<Vec<_>>(),
            [(9_000, 6400)]
        );
        // The next day is written at once, as it is.
        let (write, _) = m.plan(HashMap::from([(
            ("t".into(), "u".into(), 9_001),
            (9_001, 1, 64 * MIB),
        )]));
        assert_eq!(write.values().copied().collect::<Vec<_>>(), [(9_001, 1)]);
    }

    #[test]
    fn exact_counts_are_due_once_a_counter_is_quiet_or_when_forced() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut m = Margins::default();
        assert!(!m.due(t0, true), "nothing to write");
        // Called once: written as it is; nothing to bring down.
        m.committed(m.plan(quota(1, 6400)).1, t0);
        assert!(m.ahead(t0, true).is_empty(), "exact already");
        // Called again: written ahead.
        m.committed(m.plan(quota(2, 6400)).1, t0);
        assert!(!m.due(t0, false), "called now: not due yet");
        assert!(m.due(t0, true), "due when forced (the writer stopping)");
        assert_eq!(m.ahead(t0, true).len(), 1);
        // A counter called every 250 ms stays ahead, unwritten, however long its calls go on.
        let mut t = t0;
        for n in 3..=20 {
            t += ms(250);
            assert!(m.plan(quota(n, 6400)).0.is_empty(), "count {n}: covered");
            m.committed(m.plan(quota(n, 6400)).1, t);
            if m.due(t, false) {
                assert!(m.ahead(t, false).is_empty(), "not quiet at {n}");
                m.flushed(t, false);
            }
        }
        assert_eq!(m.plan(quota(20, 6400)).0.len(), 0, "still remembered");
        // Two counters ahead; one quiet for a second: its exact count is due, the other's is not.
        let other = ("t".into(), "v".into(), "tool".into(), "1h".into());
        let other_at = |n: i64| HashMap::from([(other.clone(), (3600, n, 6400))]);
        let mut m2 = Margins::default();
        for n in 1..=2 {
            m2.committed(m2.plan(other_at(n)).1, t0);
            m2.committed(m2.plan(quota(n, 6400)).1, t0 + ms(900));
        }
        let at = t0 + MARGIN_QUIET;
        assert!(m2.due(at, false));
        let due: Vec<_> = m2.ahead(at, false).into_iter().map(|(k, _)| k).collect();
        assert_eq!(due, std::slice::from_ref(&other), "only the quiet counter");
        m2.flushed(at, false);
        assert!(!m2.due(at, false) && m2.due(at + MARGIN_SWEEP, false));
        // Forgotten once exact: its next call is written as it is again; the busy one is kept.
        assert_eq!(writes(&m2.plan(other_at(3)).0), [(3600, 3)]);
        assert!(m2.plan(quota(2, 6400)).0.is_empty(), "the busy one is kept");
        // Forced (the writer stopping): every counter ahead, then all forgotten.
        assert_eq!(m2.ahead(at, true).len(), 1);
        m2.flushed(at, true);
        assert!(!m2.due(at, true), "nothing kept");
    }

    #[test]
    fn waiting_counters_are_retried_on_schedule_whatever_the_load() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut r = Retry::new(t0);
        assert!(!r.due(t0));
        assert!(!r.due(t0 + Duration::from_millis(99)));
        assert!(r.due(t0 + Retry::FIRST));
        assert_eq!(
            r.until_due(t0 + Duration::from_millis(40)),
            Duration::from_millis(60)
        );
        // Nothing saved: the interval doubles, up to the cap.
        let mut t = t0 + Retry::FIRST;
        let mut seen = Vec::new();
        for _ in 0..10 {
            r.tried(t, false);
            seen.push(r.until_due(t));
            t += r.until_due(t);
            assert!(r.due(t));
        }
        assert_eq!(seen[0], Duration::from_millis(200));
        assert_eq!(seen[1], Duration::from_millis(400));
        assert_eq!(*seen.last().unwrap(), Retry::MAX);
        // Something saved, or new counters waiting: back to the first interval.
        r.tried(t, true);
        assert_eq!(r.until_due(t), Retry::FIRST);
        r.tried(t, false);
        r.waiting_again();
        assert_eq!(r.until_due(t), Retry::FIRST);
        // An instant before the last try is not due (and does not panic).
        assert!(!r.due(t0));
    }

    #[test]
    fn one_tenant_filling_its_share_leaves_the_others_theirs() {
        let mut slots = [Slot::<i64>::default(); 64];
        let mut own = [Slot::<Held>::default(); 32];
        let mut t = Table::new(&mut slots);
        let mut o = Table::new(&mut own);
        // A quarter of 64 slots per tenant, an eighth per user.
        let share = Share::of(0, 64, 32, 25, 12);
        assert_eq!((share.tenant, share.user, share.tenant_users), (16, 8, 8));
        let (a1, a2, b) = (
            Owner::of("acme", "u1"),
            Owner::of("acme", "u2"),
            Owner::of("globex", "u1"),
        );
        let k = |s: &str, n: i32| Key::of(&[s.as_bytes(), &n.to_le_bytes()]);
        for n in 0..8 {
            insert_shared(&mut t, &mut o, share, a1, "acme", &k("a1", n), 100, 0, 0).unwrap();
        }
        assert_eq!(
            insert_shared(&mut t, &mut o, share, a1, "acme", &k("a1", 8), 100, 0, 0).err(),
            Some(Refused::User)
        );
        // A live key is found, not counted again.
        insert_shared(&mut t, &mut o, share, a1, "acme", &k("a1", 0), 100, 0, 0).unwrap();
        for n in 0..8 {
            insert_shared(&mut t, &mut o, share, a2, "acme", &k("a2", n), 100, 0, 0).unwrap();
        }
        let a3 = Owner::of("acme", "u3");
        assert_eq!(
            insert_shared(&mut t, &mut o, share, a3, "acme", &k("a3", 0), 100, 0, 0).err(),
            Some(Refused::Tenant)
        );
        // globex is untouched by acme's flood.
        for n in 0..8 {
            insert_shared(&mut t, &mut o, share, b, "globex", &k("b", n), 100, 0, 0).unwrap();
        }
        let held = tenants_held(&o, 0);
        let acme = held.iter().find(|h| h.0 == "acme").unwrap();
        assert_eq!((acme.1[0], acme.2), (16, 2));
        // Once acme's entries expire, a sweep gives its share back; so does an eviction.
        sweep_shared(&mut t, &mut o, 0, 150);
        assert!(tenants_held(&o, 150).is_empty(), "every share returned");
        assert_eq!(o.live(150), 0, "no share entries left behind");
        insert_shared(&mut t, &mut o, share, a3, "acme", &k("a3", 0), 300, 0, 150).unwrap();
        assert_eq!(tenants_held(&o, 150)[0].1[0], 1);
    }

    #[test]
    fn an_eviction_returns_the_evicted_owners_share() {
        let mut slots = [Slot::<i64>::default(); 16];
        let mut own = [Slot::<Held>::default(); 32];
        let mut t = Table::new(&mut slots);
        let mut o = Table::new(&mut own);
        let share = Share::of(1, 16, 32, 100, 100);
        let (a, b) = (Owner::of("acme", "u"), Owner::of("globex", "u"));
        for n in 0..16u8 {
            insert_shared(
                &mut t,
                &mut o,
                share,
                a,
                "acme",
                &Key::of(&[&[n]]),
                10,
                0,
                0,
            )
            .unwrap();
        }
        assert_eq!(
            insert_shared(
                &mut t,
                &mut o,
                share,
                b,
                "globex",
                &Key::of(&[b"x"]),
                50,
                0,
                5
            )
            .err(),
            Some(Refused::Full)
        );
        assert!(
            tenants_held(&o, 5).iter().all(|h| h.0 == "acme"),
            "a refused insert holds nothing"
        );
        insert_shared(
            &mut t,
            &mut o,
            share,
            b,
            "globex",
            &Key::of(&[b"x"]),
            50,
            0,
            20,
        )
        .unwrap();
        let held = tenants_held(&o, 20);
        let acme = held.iter().find(|h| h.0 == "acme").unwrap();
        assert_eq!(acme.1[1], 15, "the evicted entry is acme's no more");
    }

    #[test]
    fn utc_days() {
        assert_eq!(utc_day(0), 0);
        assert_eq!(utc_day(86_399), 0);
        assert_eq!(utc_day(86_400), 1);
        assert_eq!(utc_day(-1), -1);
        // 2000-01-01 is PostgreSQL's date 0.
        assert_eq!(pg_date(utc_day(946_684_800)), 0);
        assert_eq!(day_end(0), 86_400);
    }

    #[test]
    fn keys_are_length_prefixed_and_never_free() {
        assert_ne!(
            Key::of(&[b"ab", b"c"]),
            Key::of(&[b"a", b"bc"]),
            "parts must not run together"
        );
        assert_eq!(Key::of(&[b"x"]), Key::of(&[b"x"]));
        assert!(!Key::of(&[]).is_free());
    }

    #[test]
    fn coverage_counts_pages_once_and_overflow_always() {
        let mut c = Coverage::default();
        assert_eq!(c.add(&[1, 2, 2, 3]), 3);
        assert_eq!(c.add(&[3, 4]), 1);
        assert_eq!(c.count(), 4);
        assert_eq!(c.pages().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        // Beyond the bitmap, and nonsense pages, are never deduplicated (fail safe).
        assert_eq!(c.add(&[5000, 5000, 0, -1]), 4);
        assert_eq!(c.count(), 8);
        assert_eq!(c.fresh(&[1, 1024]), 1);
        assert_eq!(c.count(), 8, "fresh does not mark");
    }

    #[test]
    fn coverage_take_is_all_or_nothing() {
        let mut c = Coverage::default();
        assert_eq!(c.take(&[1, 2, 3], 4), Ok(3));
        assert_eq!(c.take(&[4, 5], 4), Err(3));
        assert_eq!(c.count(), 3, "a refused read marks nothing");
        assert_eq!(c.take(&[1, 2, 4], 4), Ok(4));
        assert_eq!(c.take(&[1, 2, 3, 4], 4), Ok(4), "re-reading is free");
    }

    #[test]
    fn table_inserts_finds_and_evicts_expired() {
        let mut slots = [Slot::<i64>::default(); 32];
        let mut t = Table::new(&mut slots);
        let k = Key::of(&[b"g1"]);
        *t.insert(&k, 100, 5, 0).unwrap() += 1;
        assert_eq!(t.get(&k, 50).copied(), Some(6));
        // Inserting a live key keeps its value.
        assert_eq!(*t.insert(&k, 100, 0, 50).unwrap(), 6);
        assert_eq!(t.get(&k, 100), None, "expired");
        assert_eq!(t.live(50), 1);
        assert_eq!(t.live(100), 0);
    }

    #[test]
    fn a_full_bucket_fails_closed_until_entries_expire() {
        let mut slots = [Slot::<i64>::default(); 16];
        let mut t = Table::new(&mut slots); // one bucket
        for i in 0..16u8 {
            t.insert(&Key::of(&[&[i]]), 100, 1, 0).unwrap();
        }
        let extra = Key::of(&[b"extra"]);
        assert_eq!(t.insert(&extra, 100, 1, 0).err(), Some(Full));
        assert!(
            t.insert(&extra, 200, 1, 100).is_ok(),
            "expired slots are reused"
        );
        assert_eq!(t.live(100), 1);
    }

    #[test]
    fn tables_are_whole_buckets() {
        assert_eq!(table_slots(0), BUCKET);
        assert_eq!(table_slots(1), BUCKET);
        assert_eq!(table_slots(BUCKET), BUCKET);
        assert_eq!(table_slots(BUCKET + 1), 2 * BUCKET);
        let mut odd = [Slot::<i64>::default(); 17];
        assert!(std::panic::catch_unwind(move || {
            Table::new(&mut odd);
        })
        .is_err());
    }

    /// Two choices keep buckets even: a table of 4,096 slots takes 3,482 keys (85 % full; the
    /// first insert fails at 3,664) without a full bucket. With one choice per key, half as many
    /// (2,048) already overflowed one. (Keys are SHA-256 of fixed inputs: deterministic.)
    #[test]
    fn tables_fill_to_ninety_percent_before_any_insert_fails() {
        let mut slots = vec![Slot::<i64>::default(); 4096];
        let mut t = Table::new(&mut slots);
        for i in 0..3482u32 {
            let k = Key::of(&[&i.to_le_bytes()]);
            t.insert(&k, 100, i64::from(i), 0).unwrap();
        }
        assert_eq!(t.live(0), 3482);
        for i in 0..3482u32 {
            let k = Key::of(&[&i.to_le_bytes()]);
            assert_eq!(
                t.get(&k, 0).copied(),
                Some(i64::from(i)),
                "every key is found"
            );
        }
    }

    #[test]
    fn chain_detects_edits_reordering_and_deletion() {
        let f1 = vec![Some("a"), None];
        let f2 = vec![Some("b"), Some("1")];
        let h1 = chain_hash("", &f1);
        let h2 = chain_hash(&h1, &f2);
        let rows = |a: Vec<Option<&'static str>>, b: Vec<Option<&'static str>>| {
            vec![("", h1.as_str(), a), (h1.as_str(), h2.as_str(), b)]
        };
        assert_eq!(first_broken(rows(f1.clone(), f2.clone())), None);
        assert_eq!(
            first_broken(rows(f1.clone(), vec![Some("b"), Some("2")])),
            Some(1)
        );
        assert_eq!(
            first_broken(rows(vec![Some("a"), Some("")], f2.clone())),
            Some(0)
        );
        // Deleting the first row breaks the link of the second.
        assert_eq!(
            first_broken(vec![(h1.as_str(), h2.as_str(), f2.clone())]),
            Some(0)
        );
        // NULL and the empty string differ.
        assert_ne!(chain_hash("", &[None]), chain_hash("", &[Some("")]));
    }

    #[test]
    fn a_chain_check_counts_every_row_and_keeps_the_first_break() {
        let f = |s: &'static str| vec![Some(s)];
        let h1 = chain_hash("", &f("a"));
        let h2 = chain_hash(&h1, &f("b"));
        let h3 = chain_hash(&h2, &f("c"));
        let mut ok = ChainCheck::default();
        assert!(ok.push("", &h1, &f("a")));
        assert!(ok.push(&h1, &h2, &f("b")));
        assert!(ok.push(&h2, &h3, &f("c")));
        assert_eq!((ok.rows(), ok.first_broken()), (3, None));
        // The second row edited: it is the first broken one; the third, intact on its own, is
        // counted after it but does not clear the break.
        let mut edited = ChainCheck::default();
        assert!(edited.push("", &h1, &f("a")));
        assert!(!edited.push(&h1, &h2, &f("B")));
        assert!(!edited.push(&h2, &h3, &f("c")));
        assert_eq!((edited.rows(), edited.first_broken()), (3, Some(1)));
        // The second row deleted: the third no longer follows the first.
        let mut deleted = ChainCheck::default();
        assert!(deleted.push("", &h1, &f("a")));
        assert!(!deleted.push(&h2, &h3, &f("c")));
        assert_eq!((deleted.rows(), deleted.first_broken()), (2, Some(1)));
    }

    #[test]
    fn links_interleave_tenants_as_separate_chains() {
        let mut heads: HashMap<Option<&str>, String> = HashMap::new();
        heads.insert(Some("a"), String::new());
        heads.insert(None, "h0".to_string());
        let a1 = link(&mut heads, &Some("a"), "x").unwrap();
        let n1 = link(&mut heads, &None, "y").unwrap();
        let a2 = link(&mut heads, &Some("a"), "z").unwrap();
        assert_eq!(a1, (String::new(), chain_hash("", &[Some("x")])));
        assert_eq!(n1, ("h0".to_string(), chain_hash("h0", &[Some("y")])));
        assert_eq!(a2, (a1.1.clone(), chain_hash(&a1.1, &[Some("z")])));
        assert_eq!(heads[&Some("a")], a2.1, "the head moves to the last row");
        // Tenant a's rows verify as one chain, on their own.
        let rows = vec![
            (a1.0.as_str(), a1.1.as_str(), vec![Some("x")]),
            (a2.0.as_str(), a2.1.as_str(), vec![Some("z")]),
        ];
        assert_eq!(first_broken(rows), None);
        // A tenant whose head nobody gave is refused, not started from scratch.
        assert_eq!(link(&mut heads, &Some("b"), "x"), None);
    }

    #[test]
    fn jsonb_text_is_what_postgres_prints() {
        let text = |j: &str| {
            let mut out = String::new();
            jsonb_text(&serde_json::from_str(j).unwrap(), &mut out);
            out
        };
        // Each expectation is `SELECT '<input>'::jsonb::text` on PostgreSQL 15.
        assert_eq!(
            text(r#"{"bb":1,"a":[true,null],"c":"x"}"#),
            r#"{"a": [true, null], "c": "x", "bb": 1}"#
        );
        assert_eq!(text(r#"[]"#), "[]");
        assert_eq!(text(r#"{}"#), "{}");
        assert_eq!(
            text(r#"["\"\\\/\b\f\n\r\t\u0001\u001f\u007f é😀"]"#),
            "[\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f} é😀\"]"
        );
        assert_eq!(
            text("[1.5, 100.0, -0.0, 0.1, 12345678901234567890]"),
            "[1.5, 100.0, 0.0, 0.1, 12345678901234567890]"
        );
        assert_eq!(numeric_text("1e-7"), "0.0000001");
        assert_eq!(numeric_text("1.5e21"), "1500000000000000000000");
        assert_eq!(numeric_text("1.50e1"), "15.0");
        assert_eq!(numeric_text("-2.5E-3"), "-0.0025");
        assert_eq!(numeric_text("123e2"), "12300");
        assert_eq!(numeric_text("-0"), "0");
        assert_eq!(numeric_text("0.000"), "0.000");
        // Keys of equal length (in bytes) sort by their bytes, shorter ones first.
        assert_eq!(
            text(r#"{"é":1,"z":2,"aa":3}"#),
            r#"{"z": 2, "aa": 3, "é": 1}"#
        );
    }
}
