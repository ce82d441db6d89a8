import Link from "next/link";

export default function NotFound() {
  return (
    <div className="empty">
      <p className="empty-title">No such page</p>
      <Link href="/">Back to the overview</Link>
    </div>
  );
}
