//! The checks memcached makes after its option loop, once every option is read: options
//! against each other (`-I` against `-m`, TLS prefixes against `-Z`, `-S` and `-Y` against
//! `-B` and `-U`, slab sizes against each other), and the defaults they imply.

use super::values::int;
use super::{Action, Builder, ITEM_SIZE_MAX, ITEM_SIZE_MIN};
use crate::setup::config::{ListenTls, MemoryLimit, ProtocolChoice};

impl Builder {
    /// The checks memcached makes after reading every option.
    pub(super) fn finish(mut self) -> Result<Action, String> {
        let cfg = &mut self.cfg;
        if let Some(n) = self.napi_ids {
            if n as usize > cfg.threads {
                return Err(format!(
                    "-N {n}: there cannot be more NAPI ids than worker threads ({})",
                    cfg.threads
                ));
            }
        }
        if cfg.item_size_max < ITEM_SIZE_MIN {
            return Err(format!(
                "-I: the item size limit cannot be less than {ITEM_SIZE_MIN} bytes"
            ));
        }
        if cfg.item_size_max > ITEM_SIZE_MAX {
            return Err("-I: the item size limit cannot be more than 1 gigabyte (1g)".into());
        }
        if let MemoryLimit::Fixed(bytes) = cfg.memory_limit {
            if cfg.item_size_max > bytes / 2 {
                return Err(format!(
                    "-I: the item size limit ({} bytes) cannot be more than half the memory \
                     limit (-m {} megabytes)",
                    cfg.item_size_max,
                    bytes >> 20
                ));
            }
        }
        let chunk_max = self.slab_chunk_max.unwrap_or(512 << 10);
        if self.slab_chunk_max.is_some() {
            if chunk_max > cfg.item_size_max {
                return Err(format!(
                    "-o slab_chunk_max ({chunk_max} bytes) cannot be more than -I ({} bytes)",
                    cfg.item_size_max
                ));
            }
            if cfg.item_size_max % chunk_max != 0 || (1 << 20) % chunk_max != 0 {
                return Err(format!(
                    "-o slab_chunk_max ({chunk_max} bytes) must divide -I ({} bytes) and \
                     1 megabyte evenly",
                    cfg.item_size_max
                ));
            }
        }
        let mut listed: Option<Vec<u32>> = None;
        if let Some(sizes) = &self.slab_sizes {
            let mut last = 0u64;
            let mut count = 0;
            for s in sizes.split('-').filter(|s| !s.is_empty()) {
                let size: u64 = int("-o slab_sizes", s, "sizes in bytes separated by -")?;
                listed
                    .get_or_insert_with(Vec::new)
                    .push(u32::try_from(size).unwrap_or(u32::MAX));
                if size < u64::from(self.slab_min_size) || size > chunk_max as u64 {
                    return Err(format!("-o slab_sizes: size {s} is out of range"));
                }
                if size <= last + 8 {
                    return Err(format!(
                        "-o slab_sizes: size {s} must be more than 8 bytes larger than the one \
                         before it"
                    ));
                }
                last = size;
                count += 1;
                if count >= 63 {
                    return Err("-o slab_sizes: too many sizes (at most 62)".into());
                }
            }
            if count == 0 {
                return Err("-o slab_sizes needs a list of sizes".into());
            }
        }
        cfg.slab_classes = crate::setup::config::slab_classes(
            self.slab_min_size,
            self.slab_growth_factor,
            u32::try_from(chunk_max).unwrap_or(u32::MAX),
            listed.as_deref(),
        );
        if self.hot_lru_pct + self.warm_lru_pct > 80 {
            return Err(format!(
                "-o hot_lru_pct ({}) plus warm_lru_pct ({}) cannot be more than 80",
                self.hot_lru_pct, self.warm_lru_pct
            ));
        }
        if self.temporary_ttl && !cfg.lru_maintainer {
            return Err(
                "-o temporary_ttl needs the LRU maintainer (drop no_lru_maintainer \
                        and no_modern)"
                    .into(),
            );
        }
        if !self.ext_files.is_empty() && cfg.item_size_max as u64 > self.ext_wbuf_size {
            return Err(format!(
                "-I ({} bytes) cannot be more than -o ext_wbuf_size ({} bytes)",
                cfg.item_size_max, self.ext_wbuf_size
            ));
        }
        for l in &cfg.listeners {
            let prefix = match l.tls {
                ListenTls::Default => continue,
                ListenTls::Plain => "notls",
                ListenTls::NoPeer => "btls",
                ListenTls::Peer => "mtls",
            };
            if !cfg.ssl.enabled {
                return Err(format!(
                    "-l: the '{prefix}' prefix is valid only when TLS is enabled (-Z)"
                ));
            }
        }
        if cfg.ssl.enabled {
            if cfg.tcp_port == 0 {
                return Err("-Z: You cannot enable SSL without a TCP port.".into());
            }
            if cfg.unix_socket.is_some() {
                return Err(
                    "-Z: TLS is for TCP listeners; -s (a unix socket) turns TCP off".into(),
                );
            }
            if cfg.ssl.settings.chain_cert.is_none() {
                return Err(
                    "-Z: TLS needs the server's certificate: -o ssl_chain_cert=FILE \
                            (and ssl_key=FILE unless the key is in the same file)"
                        .into(),
                );
            }
            // Without a CA no client certificate can be verified. memcached starts anyway;
            // so does kvcached, and says what that means for its clients.
            if cfg.ssl.settings.ca_cert.is_none() {
                let mode = cfg.ssl.settings.verify_mode;
                match mode {
                    kvtls::server::VerifyMode::None => {}
                    kvtls::server::VerifyMode::Request => self.notes.push(
                        "-o ssl_verify_mode=1 without ssl_ca_cert: client certificates are \
                         asked for but none can be verified; clients without one are served, \
                         clients that send one are refused (as memcached does)"
                            .into(),
                    ),
                    _ => self.notes.push(format!(
                        "-o ssl_verify_mode={} without ssl_ca_cert: a client certificate is \
                         required but none can be verified, so every TLS client is refused \
                         (as memcached does) but on btls: listeners; give the CAs client \
                         certificates chain to with -o ssl_ca_cert=FILE",
                        mode.number()
                    )),
                }
                if cfg.listeners.iter().any(|l| l.tls == ListenTls::Peer) {
                    self.notes.push(
                        "-l mtls: without ssl_ca_cert: a client certificate is required but \
                         none can be verified, so every client of an mtls: listener is \
                         refused (as memcached does); give the CAs client certificates chain \
                         to with -o ssl_ca_cert=FILE"
                            .into(),
                    );
                }
            }
        }
        // -S with -Y: as in memcached, -S makes the default protocol binary, then -Y makes it
        // ASCII (and refuses an explicit -B binary), so SASL applies to no listener.
        if cfg.sasl && cfg.auth_file.is_some() && !self.protocol_specified {
            self.notes.push(
                "-S with -Y: every listener speaks the ASCII protocol and authenticates with \
                 the -Y file, as in memcached; SASL (binary protocol) is not served"
                    .into(),
            );
        }
        if cfg.sasl {
            if !self.protocol_specified {
                cfg.protocol = ProtocolChoice::Binary;
            } else if cfg.protocol != ProtocolChoice::Binary {
                return Err("-S: SASL authentication needs -B binary; \
                            the ASCII protocol cannot be allowed with SASL"
                    .into());
            }
            if cfg.udp_port != 0 {
                return Err("-S: UDP cannot be used with SASL authentication (-U 0)".into());
            }
        }
        if cfg.auth_file.is_some() {
            if !self.protocol_specified {
                cfg.protocol = ProtocolChoice::Ascii;
            } else if cfg.protocol != ProtocolChoice::Ascii {
                return Err("-Y: ASCII authentication needs -B ascii; \
                            the binary protocol cannot be allowed with it"
                    .into());
            }
        }
        // Like memcached: -U alone moves the TCP port too.
        if self.udp_specified && cfg.udp_port != 0 && !self.tcp_specified {
            cfg.tcp_port = cfg.udp_port;
        }
        if cfg.auth_file.is_some() && cfg.udp_port != 0 {
            return Err("-Y: UDP cannot be used with ASCII authentication (-U 0)".into());
        }
        if !self.ext_files.is_empty() {
            // Unlike memcached ("memory restart with extstore not presently supported"),
            // -e keeps the flash tier: the snapshot names its pages (`features/warm.rs`).
            cfg.flash = Some(crate::setup::config::FlashSettings {
                files: std::mem::take(&mut self.ext_files),
                wbuf_size: self.ext_wbuf_size,
                threads: self.ext_threads,
                ignore_bad_file: self.ext_ignore_bad_file,
                recache_rate: self.ext_recache_rate,
                item_size: self.ext_item_size,
                direct: self.ext_direct,
                compact_under: self.ext_compact_under,
                drop_unread: self.ext_drop_unread,
                max_frag: self.ext_max_frag,
            });
        }
        Ok(Action::Run {
            config: Box::new(self.cfg),
            notes: self.notes,
        })
    }
}
