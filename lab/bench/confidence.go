package bench

import (
	"math/rand/v2"
	"slices"
)

// bootstrapResamples is how many resamples estimate a median's interval.
const bootstrapResamples = 2000

// medianInterval is a percentile-bootstrap 95 % interval of the median of
// v: resample v with replacement, take each resample's median, and keep
// the 2.5th and 97.5th percentiles. The seed is fixed, so one set of
// samples always gives one interval. With few samples the interval is
// rough (with 5 it can only fall on sample values) and tends to be too
// narrow: verdicts need minConfident samples, and ten or more are better.
func medianInterval(v []float64) (lo, hi float64) {
	if len(v) == 0 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	meds := make([]float64, bootstrapResamples)
	re := make([]float64, len(v))
	for i := range meds {
		for j := range re {
			re[j] = v[rng.IntN(len(v))]
		}
		slices.Sort(re)
		meds[i] = Median(re)
	}
	slices.Sort(meds)
	return meds[bootstrapResamples*25/1000], meds[bootstrapResamples*975/1000-1]
}

// Confidence is how a bar check stands once its interval is known.
type Confidence string

const (
	// Met: the whole 95 % interval is on the right side of the limit.
	Met Confidence = "met"
	// NotMet: the whole interval is on the wrong side.
	NotMet Confidence = "not met"
	// Undecided: the interval straddles the limit; more samples, or a
	// quieter machine, would tell.
	Undecided Confidence = "undecided"
	// Unmeasured: no samples.
	Unmeasured Confidence = "not measured"
)

// minConfident is the fewest paired samples an interval is trusted on.
const minConfident = 5

// confidence judges s against limit with op (≥, > or ≤) on its interval;
// fewer than minConfident samples decide nothing.
func confidence(s Stat, op string, limit float64) Confidence {
	if s.N == 0 {
		return Unmeasured
	}
	if s.N < minConfident {
		return Undecided
	}
	switch lo, hi := meets(s.Lo, op, limit), meets(s.Hi, op, limit); {
	case lo && hi:
		return Met
	case !lo && !hi:
		return NotMet
	}
	return Undecided
}

// meets reports whether x is on the right side of limit for op (≥, > or ≤).
func meets(x float64, op string, limit float64) bool {
	switch op {
	case "≥":
		return x >= limit
	case ">":
		return x > limit
	default: // ≤
		return x <= limit
	}
}

// RatioOfMedians is median(a) ÷ median(b) for two sets measured apart
// (not paired): the interval is a percentile bootstrap resampling each set
// on its own; min and max are the extreme ratios, min(a) ÷ max(b) and
// max(a) ÷ min(b); n is the smaller set's size.
func RatioOfMedians(a, b []float64) Stat {
	if len(a) == 0 || len(b) == 0 || Median(b) == 0 {
		return Stat{}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	ratios := make([]float64, bootstrapResamples)
	ra, rb := make([]float64, len(a)), make([]float64, len(b))
	for i := range ratios {
		for j := range ra {
			ra[j] = a[rng.IntN(len(a))]
		}
		for j := range rb {
			rb[j] = b[rng.IntN(len(b))]
		}
		if mb := Median(rb); mb > 0 {
			ratios[i] = Median(ra) / mb
		}
	}
	slices.Sort(ratios)
	sa, sb := slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return Stat{Median: Median(a) / Median(b), Min: sa[0] / sb[len(sb)-1], Max: sa[len(sa)-1] / sb[0], N: min(len(a), len(b)),
		Lo: ratios[bootstrapResamples*25/1000], Hi: ratios[bootstrapResamples*975/1000-1]}
}
