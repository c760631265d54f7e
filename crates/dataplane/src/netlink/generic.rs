//! Generic netlink over [`Netlink`]: a family's number, and the `netdev` family's device
//! query (`dev-get`, as `ynl --family netdev --do dev-get` shows it).

use super::wire::{malformed, Attributes, Failure, Request};
use super::Netlink;
use std::ffi::CStr;

// linux/genetlink.h, linux/netdev.h.
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XSK_FEATURES: u16 = 6;
/// `struct genlmsghdr`: command, version, reserved.
const GENLMSGHDR_LEN: usize = 4;

impl Netlink {
    /// The number of the generic netlink family `name`, or `None` where the kernel has no
    /// such family.
    pub fn family(&mut self, name: &CStr) -> Result<Option<u16>, Failure> {
        let mut request = Request::get(GENL_ID_CTRL, &[CTRL_CMD_GETFAMILY, 1, 0, 0]);
        request.attribute(CTRL_ATTR_FAMILY_NAME, name.to_bytes_with_nul());
        let mut family = None;
        match self.exchange(&mut request, |kind, payload| {
            if kind == GENL_ID_CTRL {
                family = parse_family_id(payload);
            }
        }) {
            Ok(()) => Ok(Some(family.ok_or_else(|| malformed("no family id"))?)),
            Err(Failure::Refused { errno, .. }) if errno == libc::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The AF_XDP features (`NETDEV_XSK_FLAGS_*`) the `netdev` family (number `family`)
    /// reports for interface `ifindex`: 0 when it does not report them, `None` when its
    /// answer cannot be read.
    pub fn xsk_features(&mut self, family: u16, ifindex: u32) -> Result<Option<u64>, Failure> {
        let mut request = Request::get(family, &[NETDEV_CMD_DEV_GET, 1, 0, 0]);
        request.attribute(NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
        let mut features = Some(0);
        self.exchange(&mut request, |kind, payload| {
            if kind == family {
                features = parse_xsk_features(payload);
            }
        })?;
        Ok(features)
    }
}

/// The family id of a CTRL_CMD_GETFAMILY answer.
pub fn parse_family_id(payload: &[u8]) -> Option<u16> {
    for attribute in Attributes::after(payload, GENLMSGHDR_LEN) {
        let (kind, value) = attribute.ok()?;
        if kind == CTRL_ATTR_FAMILY_ID {
            return Some(u16::from_ne_bytes(value.try_into().ok()?));
        }
    }
    None
}

/// The `xsk-features` of a dev-get answer; 0 when absent (kernels before the attribute).
pub fn parse_xsk_features(payload: &[u8]) -> Option<u64> {
    if payload.len() < GENLMSGHDR_LEN {
        return None;
    }
    let mut features = 0;
    for attribute in Attributes::after(payload, GENLMSGHDR_LEN) {
        let (kind, value) = attribute.ok()?;
        if kind == NETDEV_A_DEV_XSK_FEATURES {
            features = u64::from_ne_bytes(value.try_into().ok()?);
        }
    }
    Some(features)
}

#[cfg(test)]
mod tests {
    use super::super::wire::tests::attribute;
    use super::*;

    #[test]
    fn answers_parse_and_nothing_in_them_can_panic() {
        let mut family = vec![1, 2, 0, 0];
        family.extend(attribute(CTRL_ATTR_FAMILY_NAME, b"netdev\0"));
        family.extend(attribute(CTRL_ATTR_FAMILY_ID, &33u16.to_ne_bytes()));
        assert_eq!(parse_family_id(&family), Some(33));
        let mut dev = vec![1, 1, 0, 0];
        dev.extend(attribute(NETDEV_A_DEV_IFINDEX, &7u32.to_ne_bytes()));
        assert_eq!(parse_xsk_features(&dev), Some(0));
        dev.extend(attribute(NETDEV_A_DEV_XSK_FEATURES, &3u64.to_ne_bytes()));
        assert_eq!(parse_xsk_features(&dev), Some(3));
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (state >> (i % 8 * 8)) as u8).collect();
            let _ = (parse_family_id(&bytes), parse_xsk_features(&bytes));
        }
    }
}
