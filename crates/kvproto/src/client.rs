//! The client side of the memcache protocols: composing requests and parsing replies, as a
//! load generator or a test needs them (placeholder; being written for kvblast).
