package sdk

import (
	"context"
	"sync"
)

// DefaultConcurrency is how many tasks Map runs at once unless told.
const DefaultConcurrency = 8

// MapOption configures Map.
type MapOption func(*mapOptions)

type mapOptions struct{ concurrency int }

// Concurrency is how many tasks Map keeps running at once (default 8;
// zero or less means the default).
func Concurrency(n int) MapOption { return func(o *mapOptions) { o.concurrency = n } }

// Map calls Remote once per input (each input is the argument list) with at
// most Concurrency tasks at once, and returns the results and errors in
// input order: results[i] and errs[i] belong to inputs[i]. An input that
// failed has its error (and, when the task ran, its Result). When ctx ends,
// running tasks are cancelled and inputs not yet started get ctx's error
// without being submitted.
func (f *Function) Map(ctx context.Context, inputs [][]string, opts ...MapOption) ([]*Result, []error) {
	o := mapOptions{concurrency: DefaultConcurrency}
	for _, opt := range opts {
		opt(&o)
	}
	if o.concurrency <= 0 {
		o.concurrency = DefaultConcurrency
	}
	return mapOrdered(ctx, inputs, o.concurrency, f.Remote)
}

// mapOrdered runs call over inputs with n workers.
func mapOrdered(ctx context.Context, inputs [][]string, n int, call func(context.Context, ...string) (*Result, error)) ([]*Result, []error) {
	results := make([]*Result, len(inputs))
	errs := make([]error, len(inputs))
	n = max(1, min(n, len(inputs)))
	next := make(chan int)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for i := range next {
				if err := ctx.Err(); err != nil {
					errs[i] = err
					continue
				}
				results[i], errs[i] = call(ctx, inputs[i]...)
			}
		})
	}
	for i := range inputs {
		next <- i
	}
	close(next)
	wg.Wait()
	return results, errs
}
