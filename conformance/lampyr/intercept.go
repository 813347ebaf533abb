package lampyr

import (
	"fmt"
	"runtime/debug"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
)

// assertionFailure carries a Gomega failure out of a test's code.
type assertionFailure struct{ message, where string }

// Intercept runs f with Gomega's failures stopping f instead of failing
// the spec, and returns the first failure ("file:line: message"), or a
// panic's value and stack; "" when f ran to its end. The suite then
// decides with the declarations whether the failure fails the run.
// Gomega's handler is Ginkgo's Fail again afterwards (the suite registers
// that one). f must not assert in other goroutines.
func Intercept(f func()) (failure string) {
	gomega.RegisterFailHandler(func(message string, callerSkip ...int) {
		skip := 0
		if len(callerSkip) > 0 {
			skip = callerSkip[0]
		}
		panic(assertionFailure{message: message, where: types.NewCodeLocation(skip + 1).String()})
	})
	defer gomega.RegisterFailHandler(ginkgo.Fail)
	defer func() {
		switch r := recover().(type) {
		case nil:
		case assertionFailure:
			failure = r.where + ": " + r.message
		default:
			failure = fmt.Sprintf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	f()
	return ""
}
