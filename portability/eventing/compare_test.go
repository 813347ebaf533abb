package eventing

import (
	"strings"
	"testing"

	"lampyr.dev/serving/fixtures/events"
)

func TestDiffRecordsNamesEventAndAttribute(t *testing.T) {
	a := []events.Record{
		{Sink: sink, ID: "e1", Attempt: 1, Answer: 202, Type: "t", Extensions: map[string]string{"color": "blue", "knativearrivaltime": "x"}},
		{Sink: sink, ID: "e2", Attempt: 1, Answer: 202},
	}
	b := []events.Record{
		{Sink: sink, ID: "e1", Attempt: 1, Answer: 202, Type: "t", Extensions: map[string]string{"color": "red", "knativearrivaltime": "y"}},
	}
	d := diffRecords(a, b)
	want := []string{
		`event e1 at event-sink, attempt 1: attribute extension color: stock "blue", lampyr "red"`,
		`event e2 at event-sink, attempt 1: only on stock`,
	}
	if strings.Join(d, "\n") != strings.Join(want, "\n") {
		t.Fatalf("diff\n%s\nwant\n%s", strings.Join(d, "\n"), strings.Join(want, "\n"))
	}
}

func TestCount(t *testing.T) {
	rs := []events.Record{
		{Sink: sink, ID: "r", Attempt: 1, Answer: 500}, {Sink: sink, ID: "r", Attempt: 2, Answer: 202},
		{Sink: sink, ID: "d", Attempt: 1, Answer: 500}, {Sink: dlq, ID: "d", Attempt: 1, Answer: 202},
	}
	got := count(2, rs)
	if got != (Counts{Sent: 2, Received: 1, Attempts: 3, Retried: 1, DeadLettered: 1}) {
		t.Fatalf("%+v", got)
	}
}
