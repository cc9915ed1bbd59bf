package pkgcache

import (
	"net/url"
	"path"
	"regexp"
	"strings"
)

// Kind names the kind of an immutable download.
type Kind string

// Kinds the cache keeps.
const (
	KindDeb   Kind = "deb"   // Debian package in a pool: .../pool/.../name_version_arch.deb (.udeb)
	KindWheel Kind = "wheel" // Python wheel: name-version-...-tags.whl
	KindSdist Kind = "sdist" // Python source archive under a PyPI-style /packages/ path
	KindCRAN  Kind = "cran"  // R source or binary package: .../src/contrib/name_version.tar.gz, .../bin/.../name_version.{zip,tgz}
	KindConda Kind = "conda" // conda package: .../<subdir>/name-version-build.{conda,tar.bz2}
	// KindByHash is a Debian index file named by its own SHA-256
	// (.../dists/<suite>/.../by-hash/SHA256/<hex>), which apt fetches
	// instead of Packages.gz and the like when the Release file says
	// Acquire-By-Hash (Debian's and Ubuntu's mirrors do). Its name is its
	// hash, so it never changes and is verified by its name alone.
	KindByHash Kind = "by-hash"
)

var (
	debName   = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]*_[A-Za-z0-9.+~:-]+_[a-z0-9-]+\.u?deb$`)
	wheelName = regexp.MustCompile(`^[A-Za-z0-9._]+-[A-Za-z0-9._!+]+(-[0-9][A-Za-z0-9._]*)?-[A-Za-z0-9._]+-[A-Za-z0-9._]+-[A-Za-z0-9._]+\.whl$`)
	sdistName = regexp.MustCompile(`^[A-Za-z0-9._-]+-[0-9][A-Za-z0-9._!+-]*\.(tar\.gz|tgz|zip|tar\.bz2)$`)
	cranName  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9.]*_[0-9][0-9.-]*\.(tar\.gz|zip|tgz)$`)
	condaName = regexp.MustCompile(`^[A-Za-z0-9._+-]+-[A-Za-z0-9._+!]+-[A-Za-z0-9._+]+\.(conda|tar\.bz2)$`)
	// condaSubdirs are conda's platform folders.
	condaSubdir = regexp.MustCompile(`^(noarch|(linux|osx|win|freebsd|zos)-[a-z0-9_]+)$`)
	byHashPath  = regexp.MustCompile(`/dists/.+/by-hash/SHA256/([0-9a-f]{64})$`)
)

// Classify says whether a plain-HTTP GET of u fetches an immutable
// package file, and of which kind, by the URL alone: a name that carries
// the package's version, in the place each ecosystem's mirrors keep
// released files (which they never change). URLs with a query are never
// cached (the same path may answer differently). Indexes by name
// (Packages, Release, simple pages, PACKAGES, repodata.json) change, so
// they are never cached, only read for hashes; Debian's indexes by hash
// do not (KindByHash).
func Classify(u *url.URL) (Kind, bool) {
	if u.Scheme != "http" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Host == "" {
		return "", false
	}
	p := u.Path
	if strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
		return "", false
	}
	base := path.Base(p)
	dir := path.Dir(p)
	switch {
	case byHashPath.MatchString(p):
		return KindByHash, true
	case debName.MatchString(base) && strings.Contains(p, "/pool/"):
		return KindDeb, true
	case wheelName.MatchString(base):
		return KindWheel, true
	case sdistName.MatchString(base) && strings.Contains(p, "/packages/"):
		return KindSdist, true
	case cranName.MatchString(base) && (strings.HasSuffix(dir, "/src/contrib") || strings.Contains(dir, "/src/contrib/Archive/") ||
		strings.Contains(p, "/bin/windows/contrib/") || strings.Contains(p, "/bin/macosx/")):
		return KindCRAN, true
	case condaName.MatchString(base) && condaSubdir.MatchString(path.Base(dir)):
		return KindConda, true
	}
	return "", false
}

// NamedHash returns the SHA-256 (hex) that u's name gives its content, for
// the kinds whose name is their hash (KindByHash), or "".
func NamedHash(u *url.URL) string {
	if m := byHashPath.FindStringSubmatch(u.Path); m != nil {
		return m[1]
	}
	return ""
}
