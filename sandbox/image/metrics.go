package image

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	pulls     *prometheus.CounterVec
	cacheHits prometheus.Counter
	bytes     prometheus.Counter
	evictions prometheus.Counter
	diskBytes prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "levers9_image_pulls_total",
			Help: "Image pulls by result: fetched (downloaded and unpacked), cached (served from the cache), error.",
		}, []string{"result"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "levers9_image_cache_hits_total",
			Help: "Pulls served from the local cache without downloading blobs.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "levers9_image_pulled_bytes_total",
			Help: "Verified blob bytes downloaded from registries.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "levers9_image_gc_evictions_total",
			Help: "Images evicted by garbage collection above the disk budget.",
		}),
		diskBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "levers9_image_cache_bytes",
			Help: "Bytes used by blobs and unpacked images, as of the last GC pass.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.pulls, m.cacheHits, m.bytes, m.evictions, m.diskBytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
