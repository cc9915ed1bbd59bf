package egress

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParseHosts checks an allow-list of host names and returns it normalised
// (lower case, no trailing dot, duplicates dropped, order kept). A pattern
// is a host name ("pypi.org": that name alone) or "*." and a name
// ("*.debian.org": any name below it, not the name itself). Address
// literals, ports, schemes and paths are refused: the proxy allows names,
// and checks the addresses they resolve to itself. It is the one check of
// a proxy allow-list: sandbox.ParseNetwork runs it for the coordinator,
// the node and the sandbox, and New for the node's narrowing list.
func ParseHosts(patterns []string) ([]string, error) {
	out := make([]string, 0, len(patterns))
	seen := map[string]bool{}
	for i, p := range patterns {
		n, err := parseHost(p)
		if err != nil {
			return nil, fmt.Errorf("hosts[%d] %q: %w", i, p, err)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
}

func parseHost(p string) (string, error) {
	s := strings.TrimSuffix(strings.ToLower(p), ".")
	name, wild := strings.CutPrefix(s, "*.")
	if err := checkName(name); err != nil {
		return "", err
	}
	if wild && !strings.Contains(name, ".") {
		return "", fmt.Errorf("egress: pattern %q would allow a whole top-level domain", p)
	}
	return s, nil
}

// checkName accepts a DNS host name: dot-separated labels of letters,
// digits and hyphens (1-63 characters, no hyphen at either end), at most
// 253 characters, not all digits (an address literal).
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("egress: empty host name")
	}
	if len(name) > 253 {
		return fmt.Errorf("egress: host name longer than 253 characters")
	}
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return fmt.Errorf("egress: %q is an address, not a host name", name)
	}
	digitsAndDots := true
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("egress: host name %q has an empty or over-long label", name)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("egress: host name %q has a label starting or ending with '-'", name)
		}
		for _, c := range label {
			switch {
			case c >= 'a' && c <= 'z', c == '-':
				digitsAndDots = false
			case c >= '0' && c <= '9':
			default:
				return fmt.Errorf("egress: host name %q has a character %q outside letters, digits, '-' and '.'", name, c)
			}
		}
	}
	if digitsAndDots {
		return fmt.Errorf("egress: %q looks like an address, not a host name", name)
	}
	return nil
}

// matchHost reports whether the normalised name matches one of the
// normalised patterns.
func MatchHost(patterns []string, name string) bool {
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		} else if p == name {
			return true
		}
	}
	return false
}

// nonPublic lists the address ranges the proxy never connects to, unless
// Config.Permit names them: this network, private, shared (CGNAT),
// loopback, link-local (and so cloud metadata, 169.254.169.254), IETF
// protocol assignments, documentation, benchmarking, 6to4 relay,
// multicast and reserved ranges, and their IPv6 counterparts, including
// the forms that embed an IPv4 address (mapped, NAT64, 6to4, Teredo). The
// IPv4-compatible (::a.b.c.d, deprecated) and IPv4-translated
// (::ffff:0:a.b.c.d, SIIT) forms are refused whatever they embed: no
// public service is reached by them, and a kernel or translator may take
// them to the embedded address (issue 24: ::10.0.0.1 counted as public).
var nonPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64",
		"2001::/32", "2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// isPublic reports whether a is a global unicast address outside every
// nonPublic range.
func isPublic(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || !a.IsGlobalUnicast() || a.Zone() != "" {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}
