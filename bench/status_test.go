package bench

import "testing"

func TestStatusCounts(t *testing.T) {
	var c StatusCounts
	for _, s := range []Status{Validated, Validated, Unvalidated, Inconsistent, InfraFailed, Pending} {
		if err := c.Count(s); err != nil {
			t.Fatal(err)
		}
	}
	want := StatusCounts{Units: 6, Validated: 2, Unvalidated: 1, Inconsistent: 1, InfraFailed: 1, Pending: 1}
	if c != want {
		t.Fatalf("%+v, want %+v", c, want)
	}
	if err := c.Count("lost"); err == nil || c != want {
		t.Fatalf("an unknown status: %v, counts %+v", err, c)
	}
}
