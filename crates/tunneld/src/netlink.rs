//! Interface configuration over rtnetlink (MTU, link state, addresses, routes): the
//! dataplane's one netlink layer ([`tunneld_dataplane::netlink`]), whose socket does it all
//! (`Netlink::open`, `link_index`, `set_mtu`, `set_up`, `add_address`, `del_address`,
//! `add_route`, `del_route`), named here so the control plane reads `crate::netlink::Netlink`.
//! Nothing here reads netlink bytes.

pub(crate) use tunneld_dataplane::netlink::Netlink;
