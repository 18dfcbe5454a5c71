//! Which addresses `lull__fetch` may connect to: judged on the parsed address, never on
//! the text of a URL (the `url` crate has already turned `2130706433`, `0177.0.0.1`,
//! `0x7f.1` and `127.1` into `127.0.0.1`), and the same for every hop and every
//! address a name resolves to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why `ip` may not be fetched, or `None` when it may: a public address, or one in
/// `allow` (`LULL_FETCH_ALLOW`).
pub(crate) fn refusal(ip: IpAddr, allow: &[IpNet]) -> Option<&'static str> {
    if allow.iter().any(|net| net.contains(&ip)) {
        return None;
    }
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6, allow),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(match () {
        () if ip.is_unspecified() || a == 0 => "an unspecified address (0.0.0.0/8)",
        () if ip.is_loopback() => "a loopback address (127.0.0.0/8)",
        () if ip.is_private() => "a private address (RFC 1918)",
        () if ip.is_link_local() => {
            "a link-local address (169.254.0.0/16, where cloud metadata services answer)"
        }
        () if a == 100 && (64..128).contains(&b) => "a carrier-grade NAT address (100.64.0.0/10)",
        () if ip.is_multicast() => "a multicast address",
        () if ip.is_broadcast() || a >= 240 => "a reserved address (240.0.0.0/4)",
        () if a == 192 && b == 0 && ip.octets()[2] == 0 => "a protocol address (192.0.0.0/24)",
        () if a == 198 && (18..20).contains(&b) => "a benchmarking address (198.18.0.0/15)",
        () => return None,
    })
}

fn refused_v6(ip: Ipv6Addr, allow: &[IpNet]) -> Option<&'static str> {
    // An IPv4 address written as IPv6 is judged as the IPv4 address it reaches:
    // mapped (::ffff:a.b.c.d), compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d).
    if let Some(v4) = embedded_v4(ip) {
        return refusal(IpAddr::V4(v4), allow);
    }
    let first = ip.segments()[0];
    Some(match () {
        () if ip.is_unspecified() => "an unspecified address (::)",
        () if ip.is_loopback() => "a loopback address (::1)",
        () if first & 0xfe00 == 0xfc00 => "a private address (fc00::/7)",
        () if first & 0xffc0 == 0xfe80 => "a link-local address (fe80::/10)",
        () if first & 0xffc0 == 0xfec0 => "a site-local address (fec0::/10)",
        () if ip.is_multicast() => "a multicast address",
        () if first == 0x2001 && ip.segments()[1] == 0x0db8 => "a documentation address",
        () => return None,
    })
}

/// The IPv4 address an IPv6 one stands for, if it is one of the forms that reach IPv4.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let tail = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // Compatible (deprecated, still routed by some stacks): ::a.b.c.d, but not :: or ::1.
    if s[..6].iter().all(|x| *x == 0) && (s[6] != 0 || s[7] > 1) {
        return Some(tail());
    }
    // NAT64's well-known prefix.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|x| *x == 0) {
        return Some(tail());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(host: &str) -> bool {
        let url = url::Url::parse(&format!("http://{host}/")).unwrap();
        let ip: IpAddr = match url.host().unwrap() {
            url::Host::Ipv4(v4) => v4.into(),
            url::Host::Ipv6(v6) => v6.into(),
            url::Host::Domain(d) => panic!("{host} parsed as the name {d}"),
        };
        refusal(ip, &[]).is_some()
    }

    #[test]
    fn every_written_form_of_a_refused_address_is_refused() {
        for host in [
            "127.0.0.1",
            "2130706433",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "0x7f000001",
            "127.1",
            "0",
            "0.0.0.0",
            "10.0.0.5",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "[::1]",
            "[::]",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
            "[::127.0.0.1]",
            "[::ffff:169.254.169.254]",
            "[64:ff9b::10.0.0.1]",
            "[fc00::1]",
            "[fd12:3456::1]",
            "[fe80::1]",
            "[ff02::1]",
        ] {
            assert!(refused(host), "{host} must be refused");
        }
    }

    #[test]
    fn public_addresses_pass_and_an_allowed_range_lets_its_own_through() {
        for host in [
            "93.184.216.34",
            "1.1.1.1",
            "[2606:4700::1111]",
            "[::ffff:1.1.1.1]",
        ] {
            assert!(!refused(host), "{host} is public");
        }
        let allow: Vec<IpNet> = vec!["127.0.0.0/8".parse().unwrap()];
        assert!(refusal("127.0.0.1".parse().unwrap(), &allow).is_none());
        assert!(refusal("::ffff:127.0.0.1".parse().unwrap(), &allow).is_none());
        assert!(refusal("10.0.0.1".parse().unwrap(), &allow).is_some());
    }
}
